"""PyTorch nets as users export them, for bench/real_models.py: each published architecture
written out here with its layers, widths, strides and dilations (torchvision's compiled ops
do not load against this torch, so its model zoo is not used). Weights are random; batch
norms get running statistics from one pass over random data, so activations keep the
scale a trained net's would and the outputs are worth comparing.

Only bench/real_models.py imports this module, and only when it exports a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Activation = Callable[[], nn.Module]


def conv_bn(
    c_in: int,
    c_out: int,
    kernel: int = 1,
    stride: int = 1,
    *,
    groups: int = 1,
    dilation: int = 1,
    act: Activation | None = None,
) -> nn.Sequential:
    """Conv (no bias, "same" padding for odd kernels) + BatchNorm, then `act` if given."""
    padding = (kernel - 1) // 2 * dilation
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, kernel, stride, padding, dilation, groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Global average pool, 1x1 conv down, `act`, 1x1 conv up, `gate`, scale the input."""

    def __init__(self, channels: int, squeezed: int, act: Activation, gate: Activation) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = gate()

    def forward(self, x: Tensor) -> Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of `divisor`, never more than 10% down (the
    MobileNet rule)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class Residual(nn.Module):
    """`layers` in sequence, plus the block's input when `residual` (the shape stays): the
    bottleneck of MobileNetV2, EfficientNet and MobileNetV3."""

    def __init__(self, layers: Sequence[nn.Module], residual: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(*layers)
        self.residual = residual

    def forward(self, x: Tensor) -> Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class PooledClassifier(nn.Module):
    """`features`, global average pooling, dropout 0.2 and a linear layer: the head of
    MobileNetV2 and EfficientNet-B0."""

    def __init__(self, features: Sequence[nn.Module], width: int, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(width, classes))

    def forward(self, x: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


# --- ResNet-18 (He et al. 2015) ---------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv_bn(c_in, c_out, 3, stride, act=nn.ReLU)
        self.conv2 = conv_bn(c_out, c_out, 3)
        self.shortcut = (
            conv_bn(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.conv2(self.conv1(x)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            conv_bn(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, stride=2, padding=1)
        )
        blocks: list[nn.Module] = []
        c_in = 64
        for c_out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --- MobileNetV2 (Sandler et al. 2018), width 1.0 ---------------------------------------
class InvertedResidual(Residual):
    """1x1 expand (ReLU6), depthwise 3x3 (ReLU6), 1x1 linear projection; a residual when
    the shape stays."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(c_in, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            conv_bn(hidden, c_out, 1),
        ]
        super().__init__(layers, stride == 1 and c_in == c_out)


class MobileNetV2(PooledClassifier):
    # expansion t, channels c, repeats n, first stride s
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, classes: int = 1000) -> None:
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        c_in = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(c_in, c, s if i == 0 else 1, t))
                c_in = c
        layers.append(conv_bn(c_in, 1280, 1, act=nn.ReLU6))
        super().__init__(layers, 1280, classes)


# --- EfficientNet-B0 (Tan & Le 2019) ----------------------------------------------------
class MBConv(Residual):
    """1x1 expand (SiLU), depthwise kxk (SiLU), squeeze-excitation (to a quarter of the
    block's input channels), 1x1 projection; a residual when the shape stays (stochastic
    depth is the identity in eval mode)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int) -> None:
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(c_in, hidden, 1, act=nn.SiLU))
        layers += [
            conv_bn(hidden, hidden, kernel, stride, groups=hidden, act=nn.SiLU),
            SqueezeExcite(hidden, max(1, c_in // 4), nn.SiLU, nn.Sigmoid),
            conv_bn(hidden, c_out, 1),
        ]
        super().__init__(layers, stride == 1 and c_in == c_out)


class EfficientNetB0(PooledClassifier):
    # expansion, kernel, first stride, channels out, repeats
    SETTINGS = (
        (1, 3, 1, 16, 1),
        (6, 3, 2, 24, 2),
        (6, 5, 2, 40, 2),
        (6, 3, 2, 80, 3),
        (6, 5, 1, 112, 3),
        (6, 5, 2, 192, 4),
        (6, 3, 1, 320, 1),
    )

    def __init__(self, classes: int = 1000) -> None:
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.SiLU)]
        c_in = 32
        for expand, kernel, stride, c_out, repeats in self.SETTINGS:
            for i in range(repeats):
                layers.append(MBConv(c_in, c_out, kernel, stride if i == 0 else 1, expand))
                c_in = c_out
        layers.append(conv_bn(c_in, 1280, 1, act=nn.SiLU))
        super().__init__(layers, 1280, classes)


# --- DeepLabV3 (Chen et al. 2017) on MobileNetV3-Large (Howard et al. 2019) -------------
class V3Block(Residual):
    """MobileNetV3's bottleneck: 1x1 expand, depthwise kxk (dilated past output stride
    16), squeeze-excitation (ReLU, hard sigmoid), 1x1 projection."""

    def __init__(
        self,
        c_in: int,
        kernel: int,
        hidden: int,
        c_out: int,
        se: bool,
        act: Activation,
        stride: int,
        dilation: int,
    ) -> None:
        layers: list[nn.Module] = []
        if hidden != c_in:
            layers.append(conv_bn(c_in, hidden, 1, act=act))
        stride = 1 if dilation > 1 else stride
        layers.append(
            conv_bn(hidden, hidden, kernel, stride, groups=hidden, dilation=dilation, act=act)
        )
        if se:
            squeezed = make_divisible(hidden // 4)
            layers.append(SqueezeExcite(hidden, squeezed, nn.ReLU, nn.Hardsigmoid))
        layers.append(conv_bn(hidden, c_out, 1))
        super().__init__(layers, stride == 1 and c_in == c_out)


class MobileNetV3LargeBackbone(nn.Sequential):
    """The feature layers, output stride 16 (the last stage dilated 2), 960 channels out."""

    RE, HS = nn.ReLU, nn.Hardswish
    # in, kernel, expanded, out, SE, activation, stride, dilation
    SETTINGS: Sequence[tuple[int, int, int, int, bool, Activation, int, int]] = (
        (16, 3, 16, 16, False, RE, 1, 1),
        (16, 3, 64, 24, False, RE, 2, 1),
        (24, 3, 72, 24, False, RE, 1, 1),
        (24, 5, 72, 40, True, RE, 2, 1),
        (40, 5, 120, 40, True, RE, 1, 1),
        (40, 5, 120, 40, True, RE, 1, 1),
        (40, 3, 240, 80, False, HS, 2, 1),
        (80, 3, 200, 80, False, HS, 1, 1),
        (80, 3, 184, 80, False, HS, 1, 1),
        (80, 3, 184, 80, False, HS, 1, 1),
        (80, 3, 480, 112, True, HS, 1, 1),
        (112, 3, 672, 112, True, HS, 1, 1),
        (112, 5, 672, 160, True, HS, 2, 2),
        (160, 5, 960, 160, True, HS, 1, 2),
        (160, 5, 960, 160, True, HS, 1, 2),
    )

    def __init__(self) -> None:
        super().__init__(
            conv_bn(3, 16, 3, 2, act=nn.Hardswish),
            *(V3Block(*setting) for setting in self.SETTINGS),
            conv_bn(160, 960, 1, act=nn.Hardswish),
        )


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling: a 1x1 branch, three dilated 3x3 branches and an
    image-pooling branch, concatenated and projected to 256 channels."""

    def __init__(self, c_in: int, rates: Sequence[int] = (12, 24, 36), c_out: int = 256) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            [conv_bn(c_in, c_out, 1, act=nn.ReLU)]
            + [conv_bn(c_in, c_out, 3, dilation=r, act=nn.ReLU) for r in rates]
        )
        self.pooled = conv_bn(c_in, c_out, 1, act=nn.ReLU)
        self.project = nn.Sequential(
            conv_bn(c_out * (len(rates) + 2), c_out, 1, act=nn.ReLU), nn.Dropout(0.5)
        )

    def forward(self, x: Tensor) -> Tensor:
        pooled = self.pooled(F.adaptive_avg_pool2d(x, 1))
        pooled = F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.project(torch.cat([b(x) for b in self.branches] + [pooled], dim=1))


class DeepLabV3MobileNetV3Large(nn.Module):
    def __init__(self, classes: int = 21) -> None:
        super().__init__()
        self.backbone = MobileNetV3LargeBackbone()
        self.head = nn.Sequential(
            ASPP(960), conv_bn(256, 256, 3, act=nn.ReLU), nn.Conv2d(256, classes, 1)
        )

    def forward(self, x: Tensor) -> Tensor:
        y = self.head(self.backbone(x))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


# --- small models -----------------------------------------------------------------------
def small_cnn(classes: int = 10) -> nn.Sequential:
    """A CIFAR-size CNN: two conv pairs with max pooling, a conv, global pooling, a linear."""
    return nn.Sequential(
        conv_bn(3, 32, 3, act=nn.ReLU),
        conv_bn(32, 32, 3, act=nn.ReLU),
        nn.MaxPool2d(2),
        conv_bn(32, 64, 3, act=nn.ReLU),
        conv_bn(64, 64, 3, act=nn.ReLU),
        nn.MaxPool2d(2),
        conv_bn(64, 128, 3, act=nn.ReLU),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, classes),
    )


def transformer_encoder() -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


def bert_encoder() -> nn.TransformerEncoder:
    """BERT's encoder at BERT-mini's size (4 layers, hidden 256, 4 heads, GELU, feed-forward
    1024), over embeddings of 128 tokens."""
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=4, dim_feedforward=1024, activation="gelu", batch_first=True
    )
    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)


# --- other families: layer norm and GELU, channel shuffles, concatenation, a decoder ----
class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's, as PyTorch users write it:
    permute to channels-last and back)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, LayerNorm, Linear 4x up, GELU, Linear down, layer scale, residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.up = nn.Linear(channels, 4 * channels)
        self.down = nn.Linear(4 * channels, channels)
        self.scale = nn.Parameter(torch.full((channels,), 0.5))

    def forward(self, x: Tensor) -> Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.down(F.gelu(self.up(self.norm(y)))) * self.scale
        return x + y.permute(0, 3, 1, 2)


def convnext_small_input(dims: Sequence[int] = (48, 96, 192, 384), classes: int = 100) -> nn.Module:
    """ConvNeXt's layout at a quarter of ConvNeXt-T's widths, two blocks a stage: patchify
    stem (4x4, stride 4), LayerNorm + 2x2 stride-2 conv between stages."""
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0])]
    for i, width in enumerate(dims):
        if i:
            layers += [LayerNorm2d(dims[i - 1]), nn.Conv2d(dims[i - 1], width, 2, 2)]
        layers += [ConvNeXtBlock(width), ConvNeXtBlock(width)]
    head = [
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.LayerNorm(dims[-1]),
        nn.Linear(dims[-1], classes),
    ]
    return nn.Sequential(*layers, *head)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's unit: split the channels (stride 1) or run both branches (stride 2),
    concatenate, shuffle the two groups."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        half = c_out // 2
        self.left = (
            nn.Sequential(
                conv_bn(c_in, c_in, 3, stride, groups=c_in), conv_bn(c_in, half, act=nn.ReLU)
            )
            if stride > 1
            else nn.Identity()
        )
        self.right = nn.Sequential(
            conv_bn(c_in if stride > 1 else half, half, act=nn.ReLU),
            conv_bn(half, half, 3, stride, groups=half),
            conv_bn(half, half, act=nn.ReLU),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.stride == 1:
            kept, x = x.chunk(2, dim=1)
            out = torch.cat((kept, self.right(x)), 1)
        else:
            out = torch.cat((self.left(x), self.right(x)), 1)
        n, c, h, w = out.shape
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


def shufflenet_v2() -> nn.Module:
    """ShuffleNetV2 1.0x: stages of 4, 8 and 4 units, 116/232/464 channels."""
    layers: list[nn.Module] = [conv_bn(3, 24, 3, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)]
    c_in = 24
    for c_out, units in ((116, 4), (232, 8), (464, 4)):
        layers.append(ShuffleUnit(c_in, c_out, 2))
        layers += [ShuffleUnit(c_out, c_out, 1) for _ in range(units - 1)]
        c_in = c_out
    head = [conv_bn(c_in, 1024, act=nn.ReLU), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, *head, nn.Linear(1024, 1000))


class DenseLayer(nn.Module):
    """DenseNet's layer: BN-ReLU-1x1 (4x growth), BN-ReLU-3x3 (growth), concatenated on."""

    def __init__(self, c_in: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(c_in),
            nn.ReLU(),
            nn.Conv2d(c_in, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth),
            nn.ReLU(),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.body(x)], 1)


def densenet_two_blocks(growth: int = 32) -> nn.Module:
    """DenseNet-121's stem and first two dense blocks (6 and 12 layers) with their
    transition, then its head: a concatenation per layer."""
    layers: list[nn.Module] = [conv_bn(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1)]
    c = 64
    for block, count in enumerate((6, 12)):
        for _ in range(count):
            layers.append(DenseLayer(c, growth))
            c += growth
        if block == 0:
            layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False)]
            layers.append(nn.AvgPool2d(2))
            c //= 2
    head = [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, *head, nn.Linear(c, 1000))


class Decoder(nn.Module):
    """A GPT-style decoder: token embedding plus learned positions, pre-norm blocks under a
    causal mask, final LayerNorm, a linear head over the vocabulary."""

    def __init__(
        self, vocab: int = 1000, width: int = 256, heads: int = 4, blocks: int = 2, seq: int = 32
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(1, seq, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width,
            heads,
            4 * width,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tokens(ids) + self.positions
        return self.head(self.norm(self.blocks(x, mask=self.mask)))


class SpeechNet(nn.Module):
    """A keyword-spotting net: Conv1d front end over 40 filter banks (one strided), a
    bidirectional GRU, per-frame log-probabilities."""

    def __init__(self, classes: int = 30) -> None:
        super().__init__()
        self.front = nn.Sequential(
            nn.Conv1d(40, 128, 5, padding=2),
            nn.BatchNorm1d(128),
            nn.ReLU(),
            nn.Conv1d(128, 128, 5, stride=2, padding=2),
            nn.BatchNorm1d(128),
            nn.ReLU(),
        )
        self.rnn = nn.GRU(128, 96, batch_first=True, bidirectional=True)
        self.out = nn.Linear(192, classes)

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.rnn(self.front(x).transpose(1, 2))
        return self.out(y).log_softmax(-1)


class SmallUNet(nn.Module):
    """A three-level UNet: max-pool down, ConvTranspose and bilinear upsampling up, skip
    connections concatenated."""

    def __init__(self, classes: int = 2) -> None:
        super().__init__()

        def twice(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(
                conv_bn(c_in, c_out, 3, act=nn.ReLU), conv_bn(c_out, c_out, 3, act=nn.ReLU)
            )

        self.down1, self.down2, self.bottom = twice(3, 16), twice(16, 32), twice(32, 64)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, 2)
        self.dec2, self.dec1 = twice(64, 32), twice(48, 16)
        self.out = nn.Conv2d(16, classes, 1)

    def forward(self, x: Tensor) -> Tensor:
        a = self.down1(x)
        b = self.down2(F.max_pool2d(a, 2))
        c = self.bottom(F.max_pool2d(b, 2))
        d = self.dec2(torch.cat([self.up2(c), b], 1))
        up = F.interpolate(d, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(self.dec1(torch.cat([up, a], 1)))


def lenet5() -> nn.Sequential:
    """LeNet-5 as it was: tanh and average pooling, 1x28x28 padded to 32x32 by the first conv."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.Tanh(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120),
        nn.Tanh(),
        nn.Linear(120, 84),
        nn.Tanh(),
        nn.Linear(84, 10),
    )


# name -> (the module's maker, its input shapes, its input and output names)
NETS: dict[str, tuple[Callable[[], nn.Module], tuple[tuple[int, ...], ...], list[str], list[str]]]
NETS = {
    "resnet18": (ResNet18, ((1, 3, 224, 224),), ["image"], ["logits"]),
    "mobilenet_v2": (MobileNetV2, ((1, 3, 224, 224),), ["image"], ["logits"]),
    "efficientnet_b0": (EfficientNetB0, ((1, 3, 224, 224),), ["image"], ["logits"]),
    "deeplabv3_mnv3": (DeepLabV3MobileNetV3Large, ((1, 3, 224, 224),), ["image"], ["masks"]),
    "transformer": (transformer_encoder, ((1, 64, 256),), ["x"], ["y"]),
    "bert": (bert_encoder, ((1, 128, 256),), ["embeddings"], ["hidden"]),
    "lstm": (
        lambda: nn.LSTM(64, 128, num_layers=2, batch_first=True),
        ((1, 20, 64),),
        ["x"],
        ["y", "h", "c"],
    ),
    "gru": (
        lambda: nn.GRU(64, 128, num_layers=2, batch_first=True),
        ((1, 20, 64),),
        ["x"],
        ["y", "h"],
    ),
    "bilstm": (
        lambda: nn.LSTM(64, 128, num_layers=2, batch_first=True, bidirectional=True),
        ((1, 20, 64),),
        ["x"],
        ["y", "h", "c"],
    ),
    "mlp": (
        lambda: nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 512)),
        ((32, 1024),),
        ["x"],
        ["y"],
    ),
    "tiny_mlp": (
        lambda: nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16)),
        ((1, 16),),
        ["x"],
        ["y"],
    ),
    "small_cnn": (small_cnn, ((1, 3, 32, 32),), ["image"], ["logits"]),
    "convnext": (convnext_small_input, ((1, 3, 128, 128),), ["image"], ["logits"]),
    "shufflenet_v2": (shufflenet_v2, ((1, 3, 224, 224),), ["image"], ["logits"]),
    "densenet": (densenet_two_blocks, ((1, 3, 128, 128),), ["image"], ["logits"]),
    "decoder": (Decoder, ((1, 32),), ["ids"], ["logits"]),
    "speech": (SpeechNet, ((1, 40, 100),), ["features"], ["log_probs"]),
    "unet": (SmallUNet, ((1, 3, 64, 64),), ["image"], ["mask"]),
    "lenet5": (lenet5, ((1, 1, 28, 28),), ["image"], ["logits"]),
    "rnn": (
        lambda: nn.RNN(32, 64, num_layers=2, nonlinearity="relu", batch_first=True),
        ((1, 50, 32),),
        ["x"],
        ["y", "h"],
    ),
}
# Nets whose inputs are token ids (int64 below this vocabulary size), not noise.
TOKEN_INPUTS = {"decoder": 1000}


def calibrate(net: nn.Module, shapes: Sequence[tuple[int, ...]], batch: int = 4) -> None:
    """Random affine parameters for every batch norm, and running statistics from one
    training-mode pass over a random batch, so each normalizes what it sees."""
    norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d | nn.BatchNorm1d)]
    if not norms:
        return
    with torch.no_grad():
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average: one pass sets the statistics
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.1)
        net.train()
        net(*(torch.randn(batch, *shape[1:]) for shape in shapes))
    net.eval()


def export(name: str, path: str, seed: int = 0) -> None:
    """Build net `name` (seeded), put it in eval mode and export it to ONNX at `path` the
    way a PyTorch user does (the TorchScript exporter, opset 17)."""
    import warnings

    make, shapes, inputs, outputs = NETS[name]
    torch.manual_seed(seed)
    net = make()
    calibrate(net, shapes)
    net.eval()
    vocab = TOKEN_INPUTS.get(name)
    args = tuple(
        torch.randint(0, vocab, shape) if vocab else torch.randn(*shape) for shape in shapes
    )
    with warnings.catch_warnings():
        # the TorchScript exporter's deprecation notice, and the RNN batch-size advice
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            args,
            path,
            dynamo=False,
            opset_version=17,
            input_names=inputs,
            output_names=outputs,
        )
