"""`neuron-cli list-model`, `load`, `start`, `stop`, `unload` and `reset`: the models."""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from neuron_rtd.arguments import unreadable
from neuron_rtd.client.errors import NrtClientError
from neuron_rtd.errors import Nerr, NrtError
from neuron_rtd.tools.control.command import (
    Answer,
    Command,
    Failure,
    Listing,
    Stopped,
    UnusableInput,
    explain,
    int_at_least,
)

if TYPE_CHECKING:
    from neuron_rtd.client import Client
    from neuron_rtd.client.observe import Watch


def tensor_json(tensor: Any) -> dict[str, Any]:
    return {"name": tensor.name, "dtype": tensor.dtype, "shape": list(tensor.shape)}


def model_json(model: Any) -> dict[str, Any]:
    """A model of the ext snapshot, for --json."""
    return {
        "model_id": model.id,
        "name": model.name,
        "state": model.state,
        "ncg_id": model.ncg_id,
        "nc_count": model.nc_count,
        "mode": model.mode,
        "vncs": list(model.vncs),
        "ninfer": model.ninfer,
        "timeout_s": model.timeout_s,
        "device_bytes": model.device_bytes,
        "host_bytes": model.host_bytes,
        "session": model.session,
        "inputs": [tensor_json(t) for t in model.inputs],
        "outputs": [tensor_json(t) for t in model.outputs],
        "failure": model.failure,
    }


def loaded_model(client: Client, model_id: int) -> Any:
    """The model in the daemon's snapshot now (None when it is not loaded)."""
    return next((m for m in client.connection.snapshot().models if m.id == model_id), None)


model_id = int_at_least(1, "a model id is positive, got {value}", "model_id")


def counted(count: int, noun: str) -> str:
    """`1 model`, `2 models`, `0 NCGs`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class ListModel(Listing):
    """`neuron-cli list-model [-j]`: the models loaded on the daemon.

    After a count, one line per model: its id, its state and its NCG's id, then its name.
    READY: the running model of its NCG, the one that takes inferences; STANDBY: loaded and
    stopped (neuron-cli start runs it); FAILED: stopped after an error it cannot recover
    from; UNLOADING: on its way out. -j adds what each model takes and answers (names,
    dtypes, shapes; -1 marks an axis of varying size), its NCs and memory."""

    def read(self, args: argparse.Namespace, watch: Watch) -> Answer:
        models = sorted(watch.snapshot().models, key=lambda m: m.id)
        lines = [f"Found {counted(len(models), 'model')}"]
        lines += [f"{m.id} {m.state} {m.ncg_id} {m.name}" for m in models]
        return Answer("\n".join(lines), [model_json(m) for m in models])


ncg_choice = int_at_least(-1, "-1, 0 or an NCG id, got {value}", "ncg_choice")
positive = int_at_least(1, "expected 1 or more, got {value}", "positive")


# why a NEFF the daemon would read (--enable-direct-file-load) must be readable here too
_READ_HERE = (
    " (neuron-cli reads the NEFF too, for its inputs and outputs, even with "
    "--enable-direct-file-load)"
)


class Load(Command):
    """`neuron-cli load NEFF [--ncg-id -1|0|ID] [--enable-direct-file-load] [--ninfer N]
    [--timeout S]`: load a compiled model.

    The model outlives the command (it belongs to no session) until neuron-cli unload or
    reset. Where it goes (--ncg-id): -1 (the default), the runtime makes an NCG just big
    enough and starts the model there (the NCG goes with the model); 0, neuron-cli makes
    the NCG from the NEFF's NC count, loads the model and starts it (the NCG stays after the
    model is unloaded: neuron-cli destroy-ncg); an NCG id, the model loads into that NCG
    stopped (STANDBY) until neuron-cli start. The NEFF is streamed to the daemon, or with
    --enable-direct-file-load only its absolute path is sent and the daemon reads the file
    itself. Ctrl-C (or SIGTERM) before the answer undoes the load, the NCG it made too: exit
    130 (143) saying nothing stays loaded, or what may and the command that removes it."""

    hints = {
        Nerr.INVALID: "is it a NEFF neuron-cc compiled, whole? (neuron-cc compiles one from ONNX)"
    }
    # a path the daemon would not read (outside its neff_file_dirs, unreadable to its user):
    # nothing is wrong with the NEFF, so not the hint above
    path_hints: dict[int, str] = {
        Nerr.INVALID: "put it in one of the daemon's neff_file_dirs, or stream it (load it "
        "without --enable-direct-file-load)"
    }

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("neff", metavar="NEFF", help="the compiled model (a .neff file)")
        parser.add_argument(
            "--ncg-id",
            type=ncg_choice,
            default=-1,
            metavar="-1|0|ID",
            help="-1: an NCG the runtime makes (default); 0: an NCG neuron-cli makes; "
            "ID: that NCG (the model loads stopped)",
        )
        parser.add_argument(
            "--enable-direct-file-load",
            action="store_true",
            help="send the file's path for the daemon to read instead of streaming its bytes",
        )
        parser.add_argument(
            "--ninfer",
            type=positive,
            default=4,
            metavar="N",
            help="inferences the model may have in flight (default 4)",
        )
        parser.add_argument(
            "--timeout",
            type=positive,
            metavar="S",
            help="whole seconds one inference may take (default: the daemon's, 2)",
        )

    def check(self, args: argparse.Namespace) -> None:
        why = unreadable(args.neff, "NEFF file")
        if why and why.startswith("permission denied"):
            why += _READ_HERE
        if why:
            raise UnusableInput(f"{args.neff}: {why}")

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        from neuron_rtd.neff import read_neff_file  # numpy: only the commands that read one

        path = Path(args.neff)
        made_ncg = None
        target = args.ncg_id if args.ncg_id > 0 else None
        if args.ncg_id == 0:
            try:
                needed = read_neff_file(path).nc_count
            except NrtError as exc:
                raise Failure(f"{args.neff}: {exc}") from None
            made_ncg, _ = client.create_ncg(needed)
            target = made_ncg
        try:
            model = client.load(
                path,
                ncg=target,
                ninfer=args.ninfer,
                timeout=args.timeout,
                by_path=args.enable_direct_file_load,
                start=made_ncg is not None,
            )
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: undone, what stays said
            raise Stopped(stop, undo_load(client, stop, None, made_ncg)) from None
        except BaseException as exc:
            if made_ncg is not None:
                with contextlib.suppress(grpc.RpcError, NrtClientError):
                    client.destroy_ncg(made_ncg)
            if isinstance(exc, NrtClientError) and _path_refused(exc):
                raise Failure(explain(exc, self.path_hints)) from None
            raise
        try:
            info = loaded_model(client, model.id)
        except KeyboardInterrupt as stop:  # before the answer is out: undone too
            raise Stopped(stop, undo_load(client, stop, model.id, made_ncg)) from None
        if info is None:
            raise Failure(f"model {model.id} was loaded but is gone already (unloaded by another)")
        where = f"Loaded model {info.id} ({info.name}) on NCG {info.ncg_id}"
        if args.ncg_id == -1:
            note = "the runtime made this NCG for it; it goes when the model is unloaded"
        elif made_ncg is not None:
            note = (
                f"neuron-cli made this NCG for it; it stays after the model is unloaded: "
                f"neuron-cli destroy-ncg {made_ncg}"
            )
        else:
            note = f"stopped, as models on an explicit NCG load: neuron-cli start {info.id}"
        data = {**model_json(info), "neff": str(path.resolve())}
        data["direct_file_load"] = args.enable_direct_file_load
        return Answer(f"{where}: {info.state} ({note})", data)


def _path_refused(exc: NrtClientError) -> bool:
    """Whether the daemon refused a load by path for the path, not for the file's bytes
    (runtime/admission.py: `neff_file '...' is outside the folders ...`, `cannot read
    neff_file '...'`)."""
    return exc.code == Nerr.INVALID and "neff_file " in exc.details


def undo_load(
    client: Client, stop: KeyboardInterrupt, model_id: int | None, made_ncg: int | None
) -> str:
    """What an interrupted `load` leaves once it undid what it could (the model it loaded,
    the NCG it made and whatever loaded into it; a model loaded but not yet answered the
    client and the daemon undo, the client's notes on `stop` naming one it could not):
    `the load was undone: nothing stays loaded`, or what may stay and the command that
    removes it. Another Ctrl-C stops the undoing."""
    left = list(getattr(stop, "__notes__", ()))
    undo: list[tuple[Callable[[], object], str]] = []
    if model_id is not None:
        stays = f"model {model_id} may stay loaded: neuron-cli unload {model_id}"
        undo.append((functools.partial(client.unload, model_id), stays))
    if made_ncg is not None:
        stays = f"NCG {made_ncg} may stay: neuron-cli destroy-ncg {made_ncg}"
        undo.append((functools.partial(_clear_ncg, client, made_ncg), stays))
    for done, (call, stays) in enumerate(undo):
        try:
            call()
        except (grpc.RpcError, NrtClientError) as exc:
            gone = isinstance(exc, NrtClientError) and exc.code == Nerr.INVALID_HANDLE
            if not gone:
                left.append(f"{stays} ({exc})")
        except KeyboardInterrupt as again:
            left += list(getattr(again, "__notes__", ()))
            left += [stays for _, stays in undo[done:]]
            break
    return "; ".join(left) or "the load was undone: nothing stays loaded"


def _clear_ncg(client: Client, ncg_id: int) -> None:
    """Destroy an NCG this command made, once the models in it are unloaded (the one its
    load made, whose answer never came, unless the daemon unloaded it first)."""
    for model in client.connection.snapshot().models:
        if model.ncg_id == ncg_id:
            try:
                client.unload(model.id)
            except NrtClientError as exc:
                if exc.code != Nerr.INVALID_HANDLE:  # else the daemon unloaded it
                    raise
    client.destroy_ncg(ncg_id)


class _ModelCall(Command):
    """A call on one model by id."""

    verb = ""

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model_id", metavar="ID", type=model_id, help="the model's id")

    def call(self, client: Client, model: int) -> None:
        raise NotImplementedError

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        self.call(client, args.model_id)
        info = loaded_model(client, args.model_id)
        state = f": {info.state}" if info is not None else ""
        data = model_json(info) if info is not None else {"model_id": args.model_id}
        return Answer(f"{self.verb} model {args.model_id}{state}", data)


class Start(_ModelCall):
    """`neuron-cli start ID`: make a model the running one of its NCG.

    The model becomes READY and takes inferences; the NCG's other models become STANDBY."""

    verb = "Started"

    def call(self, client: Client, model: int) -> None:
        client.start(model)


class Stop(_ModelCall):
    """`neuron-cli stop ID`: stop a model.

    It stays loaded (STANDBY) and takes no inferences until neuron-cli start."""

    verb = "Stopped"

    def call(self, client: Client, model: int) -> None:
        client.stop(model)


class Unload(_ModelCall):
    """`neuron-cli unload ID`: unload a model.

    Its device memory is freed; an NCG the runtime made for it goes with it, an explicit
    NCG stays (neuron-cli destroy-ncg)."""

    verb = "Unloaded"

    def call(self, client: Client, model: int) -> None:
        client.unload(model)


class Reset(Command):
    """`neuron-cli reset`: unload every model and destroy every NCG on the daemon.

    Whoever made them: frameworks, other tools, neuron-cli. Lists what it cleared."""

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        before = client.connection.snapshot()
        client.unload_all()
        models = sorted(before.models, key=lambda m: m.id)
        ncgs = sorted(g.id for g in before.ncgs)
        lines = [f"Found {counted(len(models), 'model')} and {counted(len(ncgs), 'NCG')}."]
        lines += [f"Unloading {m.id} ({m.state}) :: success" for m in models]
        lines += [f"Destroying NCG {g} :: success" for g in ncgs]
        data = {"unloaded_models": [m.id for m in models], "destroyed_ncgs": ncgs}
        return Answer("\n".join(lines), data)
