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
from neuron_rtd.serving.config import read_config
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
    _refuse_circles(loader, chain, user)
    for model in step_models(user):
        with loader.lock:
            held = loader.models.get(model)
        if (held is None or not held.versions) and loader.in_repository(model):
            with contextlib.suppress(ServingError):  # its reason, which the check gives
                loader.load(model, chain=chain)


def _refuse_circles(loader: Loader, chain: tuple[str, ...], user: ModelConfig) -> None:
    """Refuse an ensemble composed of itself through the configs of the repository,
    before its load takes any composing model's lock (two loads of a circle of ensembles
    at once would each hold one and wait for the other's)."""
    for model in step_models(user):
        if model in chain:
            raise ServingError(
                Status.INVALID_ARGUMENT,
                f"circular dependency between ensembles: {chain[0]} -> ... -> {chain[-1]} -> "
                f"{model} ({' -> '.join([*chain, model])})",
            )
        if loader.repository is None or not loader.in_repository(model):
            continue
        try:
            config = read_config(loader.repository / model, model)
        except ServingError:
            continue  # its own load says what is wrong with it
        if is_ensemble(config):
            _refuse_circles(loader, (*chain, model), config)


def recheck_ensembles(loader: Loader) -> None:
    """Check every ensemble again, after a model was loaded or unloaded (with the models
    its load brought): each READY only while its composing models are there and fit.
    Called holding no lock; each ensemble is checked under its name's lock, in passes
    until one changes nothing (an ensemble may be a step of another)."""
    for _ in range(len(loader.models) + 1):
        if loader.closed.is_set():
            return
        with loader.lock:
            ensembles = [
                model.name
                for model in loader.models.values()
                if is_ensemble(model.user) and (model.versions or model.failed)
            ]
        if not any([_recheck(loader, name) for name in ensembles]):
            return


def _recheck(loader: Loader, ensemble: str) -> bool:
    """Check ensemble `ensemble` again: whether any version became READY or not."""
    with loader.name_locks.hold(ensemble):
        with loader.lock:
            model = loader.models.get(ensemble)
        if model is None or not is_ensemble(model.user):
            return False
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
        if versions.keys() == model.versions.keys():
            return False
        with loader.lock:
            if loader.models.get(ensemble) is not model:
                return False  # (re)loaded meanwhile: that load checked it
            loader.models[ensemble] = dataclasses.replace(
                model, versions=dict(sorted(versions.items())), failed=failed
            )
    for number in sorted(versions.keys() ^ model.versions.keys()):
        if number in versions:
            log.info(
                "Ensemble '%s' version %d is ready again", ensemble, number, extra={"fn": "load"}
            )
        else:
            log.warning(
                "Ensemble '%s' version %d: %s",
                ensemble,
                number,
                failed[number],
                extra={"fn": "load"},
            )
    return True
