"""The 1024-byte NEFF container header.

All fields are little-endian, packed with no alignment padding (`struct` format
`HEADER_FORMAT`), then zero-padded to `HEADER_SIZE` bytes:

    offset  size  field
    ------  ----  -----------------------------------------------------------------
         0     8  magic               b"NEFF\\x00RTD"
         8     8  package_version     u64, always 1 (the container layout)
        16     8  header_size         u64, always 1024
        24     8  data_size           u64, bytes of data after the header
        32     4  neff_major          u32 \\ the NEFF format version
        36     4  neff_minor          u32 /
        40    64  build_version       utf-8, NUL padded (the tool that built it)
       104     4  nc_count            u32, NCs the model needs in normal mode
                                      (the sum of its Neuron nodes' NCs)
       108    32  sha256              sha256 of the data
       140    16  uuid                the model's UUID, 16 raw bytes
       156   256  name                utf-8, NUL padded
       412     4  requested_nc_count  u32
       416     4  ncs_per_node        u32, the largest Neuron node's NCs
       420     8  features            u64 feature bits: bit 0 = data is gzip-compressed
       428   596  zero padding

The data after the header is a tar archive (gzip-compressed when FEATURE_GZIP is set).
"""

from __future__ import annotations

import dataclasses
import struct
import uuid as uuidlib

from neuron_rtd.errors import NeffInvalid, UnsupportedVersion

MAGIC = b"NEFF\x00RTD"
PACKAGE_VERSION = 1
HEADER_SIZE = 1024
HEADER_FORMAT = "<8sQQQII64sI32s16s256sIIQ"
NEFF_VERSION: tuple[int, int] = (2, 0)
SUPPORTED_VERSIONS: tuple[tuple[int, int], tuple[int, int]] = ((2, 0), (2, 0))
FEATURE_GZIP = 1 << 0
KNOWN_FEATURES = FEATURE_GZIP
BUILD_VERSION_BYTES = 64
NAME_BYTES = 256


@dataclasses.dataclass(frozen=True)
class NeffHeader:
    """The decoded container header (see the module docstring for the layout)."""

    package_version: int
    header_size: int
    data_size: int
    major: int
    minor: int
    build_version: str
    nc_count: int
    sha256: bytes
    uuid: uuidlib.UUID
    name: str
    requested_nc_count: int
    ncs_per_node: int
    features: int

    @property
    def version(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def gzip(self) -> bool:
        return bool(self.features & FEATURE_GZIP)

    def pack(self) -> bytes:
        """The 1024 header bytes; NeffInvalid if a string field does not fit."""
        fields = struct.pack(
            HEADER_FORMAT,
            MAGIC,
            self.package_version,
            self.header_size,
            self.data_size,
            self.major,
            self.minor,
            _encode_text(self.build_version, BUILD_VERSION_BYTES, "build version"),
            self.nc_count,
            self.sha256,
            self.uuid.bytes,
            _encode_text(self.name, NAME_BYTES, "name"),
            self.requested_nc_count,
            self.ncs_per_node,
            self.features,
        )
        return fields.ljust(HEADER_SIZE, b"\x00")


def _encode_text(text: str, size: int, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > size:
        raise NeffInvalid(f"NEFF {what} is {len(raw)} bytes of utf-8, the header holds {size}")
    return raw


def _decode_text(raw: bytes, what: str) -> str:
    try:
        return raw.rstrip(b"\x00").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NeffInvalid(f"NEFF header {what} is not utf-8: {exc}") from None


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def check_version(version: tuple[int, int]) -> None:
    """UnsupportedVersion unless `version` lies within SUPPORTED_VERSIONS (inclusive)."""
    low, high = SUPPORTED_VERSIONS
    if not low <= version <= high:
        raise UnsupportedVersion(
            f"NEFF version {format_version(version)} is not supported: this runtime runs "
            f"versions {format_version(low)} to {format_version(high)}"
        )


def parse_header(data: bytes | memoryview) -> NeffHeader:
    """Decode and check the header at the start of `data` (which may hold more after it)."""
    if bytes(data[: len(MAGIC)]) != MAGIC[: len(data)]:  # a short file that is not one either
        raise NeffInvalid(f"not a NEFF: the data does not begin with the NEFF magic {MAGIC!r}")
    if len(data) < HEADER_SIZE:
        raise NeffInvalid(f"NEFF is truncated: {len(data)} bytes, a header alone is {HEADER_SIZE}")
    fields = struct.unpack_from(HEADER_FORMAT, data)
    (_, package_version, header_size, data_size, major, minor) = fields[:6]
    if header_size != HEADER_SIZE:
        raise NeffInvalid(f"NEFF header size is {header_size}, expected {HEADER_SIZE}")
    if package_version != PACKAGE_VERSION:
        raise UnsupportedVersion(
            f"NEFF package version {package_version} is not supported: "
            f"this runtime reads package version {PACKAGE_VERSION}"
        )
    check_version((major, minor))
    header = NeffHeader(
        package_version=package_version,
        header_size=header_size,
        data_size=data_size,
        major=major,
        minor=minor,
        build_version=_decode_text(fields[6], "build version"),
        nc_count=fields[7],
        sha256=fields[8],
        uuid=uuidlib.UUID(bytes=fields[9]),
        name=_decode_text(fields[10], "name"),
        requested_nc_count=fields[11],
        ncs_per_node=fields[12],
        features=fields[13],
    )
    _check_features(header.features)
    return header


def _check_features(features: int) -> None:
    unknown = features & ~KNOWN_FEATURES
    if unknown:
        raise NeffInvalid(
            f"NEFF header sets unknown feature bits {unknown:#x} (known: {KNOWN_FEATURES:#x})"
        )
