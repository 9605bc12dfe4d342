"""Loading an ensemble (`neuron_rtd/serving/ensemble.py`) as Triton does, for the
loader (`neuron_rtd/serving/loading.py`): its composing models loaded with it when the
repository has them, and every ensemble checked again whenever a model it is composed
of is loaded or unloaded, READY only while they are there and fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

from neuron_rtd.proto import model_config_pb
from neuron_rtd.serving.api import ServingError, Status
from neuron_rtd.serving.ensemble import EnsembleVersion, load_ensemble
from neuron_rtd.serving.ensemble_config import is_ensemble, step_models

if TYPE_CHECKING:
    from neuron_rtd.serving.loading import Loader, Served

log = logging.getLogger("nrtd.KSERVE")

ModelConfig = model_config_pb.ModelConfig


def load_composing(loader: Loader, name: str, user: ModelConfig, chain: tuple[str, ...]) -> None:
    """Ensemble `name`'s composing models, loaded first when they are in the
    repository and not served yet (Triton loads them with it); one served already is
    used as it is. A composing model that cannot load is the ensemble's reason."""
    chain = (*chain, name)
    for model in step_models(user):
        if model in chain:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"circular dependency between ensembles: {chain[0]} -> ... -> {name} -> "
                f"{model} ({' -> '.join([*chain, model])})",
            )
        with loader.lock:
            held = loader.models.get(model)
        if (held is None or not held.versions) and loader.in_repository(model):
            with contextlib.suppress(ServingError):  # its reason, which the check gives
                loader.load(model, chain=chain)


def recheck_ensembles(loader: Loader, name: str, chain: tuple[str, ...] = ()) -> None:
    """Check again the ensembles composed of model `name`, which was just (un)loaded:
    each READY only while its composing models are there and fit (those of `chain`,
    whose loads are under way, check themselves). Then the ensembles composed of
    those, in turn."""
    if loader.closed.is_set():
        return
    with loader.lock:
        dependents = [
            model.name
            for model in loader.models.values()
            if is_ensemble(model.user)
            and name in step_models(model.user)
            and model.name not in chain
            and model.name != name
        ]
    for ensemble in dependents:
        with loader.name_locks.hold(ensemble):
            with loader.lock:
                model = loader.models.get(ensemble)
            if model is None or not (model.versions or model.failed):
                continue
            versions: dict[int, Served] = {}
            failed: dict[int, str] = {}
            for number, served in model.versions.items():
                try:
                    if isinstance(served, EnsembleVersion):
                        served.check()
                    versions[number] = served
                except ServingError as exc:
                    failed[number] = exc.message
            for number, why in model.failed.items():
                if model.scanned is not None and number not in model.scanned.versions:
                    failed[number] = why  # its folder is missing: no check mends that
                    continue
                try:
                    versions[number] = load_ensemble(
                        ensemble,
                        number,
                        model.user,
                        f"the config of ensemble '{ensemble}'",
                        loader.models,
                        loader.steps,
                        loader.runtime.compute_gate,
                    )
                except ServingError as exc:
                    failed[number] = exc.message
            with loader.lock:
                if loader.models.get(ensemble) is model:
                    loader.models[ensemble] = dataclasses.replace(
                        model, versions=dict(sorted(versions.items())), failed=failed
                    )
            for number, why in failed.items():
                if number not in model.failed:
                    log.warning(
                        "Ensemble '%s' version %d: %s",
                        ensemble,
                        number,
                        why,
                        extra={"fn": "load"},
                    )
        recheck_ensembles(loader, ensemble, (*chain, name))
