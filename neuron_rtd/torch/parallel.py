"""`DataParallel(traced)`: a traced module run on several NeuronCore Groups at once, as
`torch.neuron.DataParallel` ran one on several NeuronCores: a copy loaded per group, each
call's batch split along `dim` between them, the parts run in threads (the client's calls
release the GIL while they wait), the outputs joined again along `dim`."""

from __future__ import annotations

import concurrent.futures
import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from neuron_rtd.client import NCG_SIZES_ENV, NrtClientError, default_address
from neuron_rtd.client.observe import Watch
from neuron_rtd.torch.errors import InputMismatch, NeuronTorchError
from neuron_rtd.torch.module import NeuronModule, shown
from neuron_rtd.torch.runtime import Place, ncg_sizes_from_env, said


class DataParallel(nn.Module):
    """`module`'s copies, one per NCG, sharing each call's batch.

    The groups: those of `NEURONCORE_GROUP_SIZES` (`device_ids` picks some by index), or
    else one group of one NeuronCore per entry of `device_ids` (default: one per NC free on
    the daemon). They are this object's own (its own client and session), released when
    it is deleted. A module traced with `dynamic_batch_size=True` takes any batch, split
    in as many parts as there are copies; one traced at a fixed batch B takes a multiple
    of B, run B at a time."""

    def __init__(
        self, module: NeuronModule, device_ids: Sequence[int] | None = None, dim: int = 0
    ) -> None:
        super().__init__()
        if not isinstance(module, NeuronModule):
            raise NeuronTorchError(
                "DataParallel takes a module made by neuron_rtd.torch.trace, got a "
                f"{type(module).__name__}"
            )
        self.module = module
        self.dim = dim
        sizes = _group_sizes(device_ids)
        place = Place(None, sizes)
        self.copies = [module.on(place) for _ in sizes]
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=2 * len(sizes), thread_name_prefix="neuron-dp"
        )
        weakref.finalize(self, _release, [c.loaded for c in self.copies], place, self._pool)

    @property
    def ncg_sizes(self) -> tuple[int, ...]:
        """The NC count of each copy's group."""
        place = self.copies[0].loaded.place
        return place.ncg_sizes if place is not None else ()

    def forward(self, *args: Any) -> Any:
        leaves, spec = pytree.tree_flatten(args)
        traced = self.module
        if spec != traced.in_spec or not all(isinstance(t, torch.Tensor) for t in leaves):
            raise InputMismatch(
                f"{traced.traced_name} was traced with arguments {shown(traced.in_spec)}; "
                f"got {shown(spec, leaves)}"
            )
        parts = self._split(leaves)
        futures = [
            self._pool.submit(self.copies[i % len(self.copies)].loaded, part)
            for i, part in enumerate(parts)
        ]
        results = [future.result() for future in futures]
        joined = [torch.cat(pieces, self.dim) for pieces in zip(*results, strict=True)]
        return pytree.tree_unflatten(joined, traced.out_spec)

    def _split(self, leaves: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Each part's inputs: as many parts as copies (a dynamic batch), or parts of the
        traced batch size."""
        if not leaves or any(t.dim() <= self.dim for t in leaves):
            raise InputMismatch(f"every input needs an axis {self.dim} (dim) to split along")
        batch = leaves[0].shape[self.dim]
        package = self.module.package
        if package.batch_limit is not None and self.dim == 0:
            count = max(1, min(len(self.copies), batch))
            split = [t.tensor_split(count, self.dim) for t in leaves]
            return [list(p) for p in zip(*split, strict=True)]
        traced = package.inputs[0].shape[self.dim]
        if batch % traced:
            raise InputMismatch(
                f"a batch of {batch} along dim {self.dim}: this module was traced at "
                f"{traced} without dynamic_batch_size, so give a multiple of {traced} (or "
                "trace it with dynamic_batch_size=True)"
            )
        return [list(p) for p in zip(*(t.split(traced, self.dim) for t in leaves), strict=True)]


def _group_sizes(device_ids: Sequence[int] | None) -> tuple[int, ...]:
    """The NC count of each copy's group (see DataParallel)."""
    configured = ncg_sizes_from_env()
    if configured:
        if device_ids is None:
            return configured
        unknown = [i for i in device_ids if not 0 <= i < len(configured)]
        if unknown:
            raise NeuronTorchError(
                f"device_ids {list(device_ids)}: {NCG_SIZES_ENV} makes groups 0.."
                f"{len(configured) - 1}, so {unknown} name none"
            )
        return tuple(configured[i] for i in device_ids)
    count = len(device_ids) if device_ids is not None else _free_ncs()
    if count < 1:
        raise NeuronTorchError("DataParallel needs at least one NeuronCore: none is free")
    return (1,) * count


def _free_ncs() -> int:
    """NeuronCores in no group on the daemon now."""
    try:
        with Watch(default_address()) as watch:
            return sum(1 for nc in watch.snapshot().ncs if nc.ncg_id == 0)
    except NrtClientError as exc:
        raise said(exc) from None
    except ValueError as exc:  # NEURON_RTD_ADDRESS names no address
        raise NeuronTorchError(str(exc)) from None


def _release(copies: list[Any], place: Place, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False)
    for loaded in copies:
        with contextlib.suppress(NeuronTorchError):
            loaded.unload()
    place.close()
