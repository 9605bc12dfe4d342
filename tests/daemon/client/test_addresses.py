"""Addresses, read one way everywhere (client/address.py), and a daemon not reached, said
at once with why (client/reach.py).

A bare socket path is an address for the Client, every tool and the daemon's `-g`; the
daemon listens on `NEURON_RTD_ADDRESS` as its clients look there (flags over it, it over
the config file). No socket, a stale one, a door closed to the caller (as another uid:
root passes every door) and a file that is no socket are each said in under a second
or so, in the same words from the Client and every tool, with no wait for a daemon that
is not coming; the wait is kept where a daemon is likely back soon.
"""

from __future__ import annotations

import fcntl
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from neuron_rtd.cli import neuron_ls
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client import AddressError, Client, NrtConnectionError, default_address, reach
from neuron_rtd.client import errors as client_errors
from neuron_rtd.client.address import ADDRESS_ENV, DEFAULT_ADDRESS, grpc_target, parse_address
from neuron_rtd.client.observe import Watch
from neuron_rtd.daemon.config import load_config
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.typed_json import ConfigError

OTHER_UID = OTHER_GID = 65534  # nobody, nogroup: a caller the socket's group does not admit


# --- reading an address ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("unix:/run/neuron.sock", "unix:/run/neuron.sock"),
        ("unix:///run/neuron.sock", "unix:/run/neuron.sock"),
        ("/run/neuron.sock", "unix:/run/neuron.sock"),
        ("/tmp/../run/neuron.sock", "unix:/run/neuron.sock"),
        ("127.0.0.1:50051", "127.0.0.1:50051"),
        ("localhost:1", "localhost:1"),
        ("[::1]:50051", "[::1]:50051"),
        ("unix-abstract:neuron", "unix-abstract:neuron"),
        ("dns:///localhost:50051", "dns:///localhost:50051"),
    ],
)
def test_what_an_address_names(given: str, target: str) -> None:
    assert grpc_target(given) == target
    assert grpc_target(target) == target  # read again, the same


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("./neuron.sock", "neuron.sock", "unix:neuron.sock", "sub/../neuron.sock"):
        address = parse_address(given)
        assert address.target == f"unix:{tmp_path}/neuron.sock", given
        assert address.unix_path == tmp_path / "neuron.sock" and not address.host_port
    (tmp_path / "odd:name").touch()  # a colon and no slash: a path only when it is there
    assert grpc_target("odd:name") == f"unix:{tmp_path}/odd:name"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert grpc_target("~/n.sock") == f"unix:{tmp_path}/n.sock"
    assert parse_address("localhost:50051").host_port


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("", "an empty address"),
        ("unix:", "names no path"),
        ("unix://run/neuron.sock", "after unix:// comes an absolute path"),
        ("no-such:name", "neither a socket path"),
    ],
)
def test_a_text_that_names_no_address_is_refused(given: str, words: str) -> None:
    with pytest.raises(AddressError, match=words):
        grpc_target(given)


def test_the_environment_is_read_the_same_way(tmp_path: Path) -> None:
    assert default_address({}) == DEFAULT_ADDRESS
    assert default_address({ADDRESS_ENV: f"{tmp_path}/n.sock"}) == f"unix:{tmp_path}/n.sock"
    with pytest.raises(AddressError, match=rf"^\${ADDRESS_ENV}: address 'x:y' is neither"):
        default_address({ADDRESS_ENV: "x:y"})


# --- the daemon's address: flags, then NEURON_RTD_ADDRESS, then the file --------------
@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "neuron-rtd.json"
    path.write_text('{"server_address": "unix:/tmp/from-the-file.sock"}\n')
    path.chmod(0o644)
    return str(path)


def test_the_daemons_address_flags_then_environment_then_file(
    config_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def address(flag: str | None, env: dict[str, str]) -> str:
        overrides = {"server_address": flag}
        return load_config(path=config_file, overrides=overrides, environ=env).server_address

    env = {ADDRESS_ENV: f"{tmp_path}/from-env.sock"}
    assert address(None, {}) == "unix:/tmp/from-the-file.sock"
    assert address(None, env) == f"unix:{tmp_path}/from-env.sock"
    assert address("/tmp/from-g.sock", env) == "unix:/tmp/from-g.sock"
    monkeypatch.chdir(tmp_path)
    assert address("./here.sock", {}) == f"unix:{tmp_path}/here.sock"
    assert address("127.0.0.1:50051", env) == "127.0.0.1:50051"
    assert address("/tmp/g.sock", {ADDRESS_ENV: "x:y"}) == "unix:/tmp/g.sock"  # not read
    with pytest.raises(ConfigError, match=rf"^\${ADDRESS_ENV}: server_address: address 'x:y'"):
        address(None, {ADDRESS_ENV: "x:y"})
    with pytest.raises(ConfigError, match=r"listens on a socket path .* not on 'unix-abstract:n'"):
        address("unix-abstract:n", {})


# --- a bare path, everywhere, to real daemons ------------------------------------------
class Daemon(DaemonProcess):
    """The daemon with no address flag but those in `args` (none: it reads
    NEURON_RTD_ADDRESS)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "neuron_rtd.daemon.main", "-x", *self.args]


@pytest.fixture
def no_settings(work: Path) -> list[str]:
    """`-c` a config of no settings (not whatever /etc/neuron-rtd holds)."""
    path = work / "empty.json"
    path.write_text("{}\n")
    path.chmod(0o644)
    return ["-c", str(path)]


def tool(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A console command as a user runs it (`neuron-cli` as `python -m ...neuron_cli`)."""
    full = {k: v for k, v in os.environ.items() if k != ADDRESS_ENV}
    return subprocess.run(
        [sys.executable, "-m", f"neuron_rtd.cli.{command[0]}", *command[1:]],
        env={**full, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_daemon_on_neuron_rtd_address_answers_at_its_bare_path(
    work: Path, no_settings: list[str]
) -> None:
    """No -g: the daemon listens on $NEURON_RTD_ADDRESS, given as a bare path; the
    Client, Watch, neuron-cli and neuron-ls reach it by that path too."""
    bare = str(work / "bare.sock")
    env = {ADDRESS_ENV: bare}
    with Daemon(args=no_settings, sim_root=work / "sim", env=env) as daemon:
        assert Path(bare).is_socket()
        assert f"Server listening on unix:{bare}" in daemon.log()
        with Client(bare) as client:
            assert client.address == f"unix:{bare}" and client.version()
        with Watch(bare) as watch:
            assert watch.describe().pid == daemon.pid
        listed = tool("neuron_cli", "-a", bare, "list-ncg", "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["ncgs"] == []
        by_env = tool("neuron_cli", "list-model", "--json", env=env)
        assert by_env.returncode == 0 and json.loads(by_env.stdout) is not None, by_env.stderr
        ls = tool("neuron_ls", "-a", bare, "--json-output")
        assert ls.returncode == 0 and f'"address": "unix:{bare}"' in ls.stdout, ls.stderr


def test_the_daemons_g_takes_a_relative_bare_path_over_the_environment(
    work: Path, no_settings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(work)
    elsewhere = {ADDRESS_ENV: str(work / "not-this.sock")}
    args = ["-g", "./given.sock", *no_settings]
    with Daemon(args=args, sim_root=work / "sim", env=elsewhere):
        assert (work / "given.sock").is_socket() and not (work / "not-this.sock").exists()
        with Client("given.sock") as client:  # a bare name, as the daemon was given it
            assert client.version()


# --- no daemon there: the reason, at once, in the same words from every tool ----------
@pytest.fixture
def places(work: Path) -> Iterator[dict[str, str]]:
    """An address of each kind where no daemon answers."""
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(work / "bound.sock"))  # bound, never listening: refused
    closed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    closed.bind(str(work / "closed.sock"))
    closed.listen()
    closed.close()  # a daemon that died: its socket file left behind
    (work / "plain").write_text("not a socket")
    yield {
        "missing": f"unix:{work}/none.sock",
        "bound": f"unix:{work}/bound.sock",
        "closed": f"{work}/closed.sock",  # bare
        "file": f"unix:{work}/plain",
    }
    bound.close()


WORDS = {
    "missing": "no socket {path}, so no daemon listens there: start one (systemctl start "
    "neuron-rtd, or neuron-rtd -g {target}), or name another address (-a ADDRESS, or "
    "NEURON_RTD_ADDRESS)",
    "bound": "the socket {path} is there but no daemon listens on it",
    "closed": "the socket {path} is there but no daemon listens on it (one stopped or died "
    "without removing it): start one (systemctl start neuron-rtd, or neuron-rtd -g {target}: "
    "it takes the socket over)",
    "file": "{path} is a regular file, not a socket: name another address",
}


@pytest.fixture
def ready_waits(monkeypatch: pytest.MonkeyPatch) -> list[grpc.Channel]:
    """The channels a client waits on for a daemon to come (back), as they come: the
    wait, not the time it takes, tells "at once" from "after a retry"."""
    waits: list[grpc.Channel] = []
    ready = grpc.channel_ready_future

    def counted(channel: grpc.Channel) -> grpc.Future:
        waits.append(channel)
        return ready(channel)

    monkeypatch.setattr(client_errors.grpc, "channel_ready_future", counted)
    return waits


@pytest.mark.parametrize("kind", sorted(WORDS))
def test_no_daemon_is_said_at_once_with_the_reason(
    kind: str, places: dict[str, str], ready_waits: list[grpc.Channel]
) -> None:
    target = grpc_target(places[kind])
    path = target.removeprefix("unix:")
    expected = f"no runtime answers at {target}: " + WORDS[kind].format(path=path, target=target)
    with Client(places[kind], timeout_s=30) as client, pytest.raises(NrtConnectionError) as info:
        client.version()
    assert ready_waits == []  # no wait for a daemon that is not coming
    assert info.value.details.startswith(expected), info.value.details
    assert info.value.details == f"no runtime answers at {target}: {reach.unreachable(target)}"
    with Client(places[kind]) as client, pytest.raises(NrtConnectionError) as info:
        client.load(build_mlp((4, 4)).neff)  # a session opened first: the same
    assert info.value.details.startswith(expected)


def test_every_tool_says_it_in_the_same_words(places: dict[str, str]) -> None:
    for kind in ("missing", "closed"):
        given = places[kind]
        target = grpc_target(given)
        said = f"no runtime answers at {target}: {reach.unreachable(target)}"
        for command in (
            ("neuron_cli", "-a", given, "list-model"),
            ("neuron_cli", "list-ncg"),  # from NEURON_RTD_ADDRESS
            ("neuron_ls", "-a", given),
            ("neuron_top", "--once", given),
        ):
            done = tool(*command, env={ADDRESS_ENV: given})
            prog = command[0].replace("_", "-")
            assert done.returncode == 1 and f"{prog}: {said}" in done.stderr, done.stderr


def test_tcp_refused_is_said_at_once(ready_waits: list[grpc.Channel]) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with Client(f"127.0.0.1:{port}") as client, pytest.raises(NrtConnectionError) as info:
        client.version()
    assert ready_waits == []
    assert f"no runtime answers at 127.0.0.1:{port}" in info.value.details


def test_a_malformed_address_is_a_usage_error() -> None:
    for command in (("neuron_cli", "-a", "x:y", "list-model"), ("neuron_top", "--once", "x:y")):
        done = tool(*command)
        assert done.returncode == 2 and "address 'x:y' is neither a socket path" in done.stderr
    done = tool("neuron_ls", env={ADDRESS_ENV: "x:y"})
    assert done.returncode == 2 and f"${ADDRESS_ENV}: address 'x:y'" in done.stderr


# --- when a wait is worth it -------------------------------------------------------------
def test_a_wait_only_where_a_daemon_is_likely_back(places: dict[str, str], work: Path) -> None:
    for kind in ("missing", "bound", "file"):
        assert not reach.restart_likely(places[kind], answered=False), kind
    assert reach.restart_likely(places["bound"], answered=True)  # lost its daemon: restarting
    assert not reach.restart_likely(places["file"], answered=True)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(work / "up.sock"))
    listening.listen()
    assert reach.restart_likely(f"unix:{work}/up.sock", answered=False)
    listening.close()
    # a daemon starting holds the socket's lock before the socket is there
    with open(work / "none.sock.lock", "a+") as lock:
        assert not reach.restart_likely(places["missing"], answered=False)
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert reach.restart_likely(places["missing"], answered=False)
    with socket.socket() as port:  # TCP: a port that accepts (the daemon said UNAVAILABLE)
        port.bind(("127.0.0.1", 0))
        port.listen()
        assert reach.restart_likely(f"127.0.0.1:{port.getsockname()[1]}", answered=False)
    assert reach.restart_likely("127.0.0.1:1", answered=True)
    assert not reach.restart_likely("127.0.0.1:1", answered=False)  # refused: said at once


def test_a_client_that_lost_its_daemon_waits_for_it(
    work: Path, monkeypatch: pytest.MonkeyPatch, ready_waits: list[grpc.Channel]
) -> None:
    """Killed, the daemon leaves a stale socket: a client it answered waits (for
    systemd's restart) before it says so; a new client says so at once."""
    monkeypatch.setattr(client_errors, "RECONNECT_S", 0.5)
    with DaemonProcess(sim_root=work / "sim") as daemon, Client(daemon.address) as client:
        assert client.version()
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        with pytest.raises(NrtConnectionError, match="is there but no daemon listens on it"):
            client.version()
        assert len(ready_waits) == 1  # it waited, once
        with Client(daemon.address) as new, pytest.raises(NrtConnectionError):
            new.version()
        assert len(ready_waits) == 1  # the new one did not


# --- permission denied, as a user the socket's group does not admit ---------------------
def as_other_user() -> list[str]:
    return ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_GID}", "--clear-groups", "--"]


@pytest.fixture
def other_user() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to connect as another user")
    probe = subprocess.run(
        [*as_other_user(), sys.executable, "-c", "import neuron_rtd"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"uid {OTHER_UID} cannot run this environment's Python")


@pytest.fixture
def open_work(work: Path) -> Path:
    work.chmod(0o755)  # the other user may look in, not necessarily further
    return work


@pytest.mark.usefixtures("other_user")
def test_permission_denied_names_the_group_and_what_to_do(open_work: Path) -> None:
    group = grp.getgrgid(os.getegid()).gr_name
    nobody = pwd.getpwuid(OTHER_UID).pw_name
    nogroup = grp.getgrgid(OTHER_GID).gr_name
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(open_work / "n.sock"))
    server.listen()  # a daemon there, for its group only
    os.chmod(open_work / "n.sock", 0o660)
    folder = open_work / "rtd"  # as /run/neuron-rtd, the package's, behind /run/neuron.sock
    folder.mkdir(mode=0o750)
    (open_work / "link.sock").symlink_to(folder / "n.sock")
    cases = {
        "n.sock": f"the socket {open_work}/n.sock is for group {group} (mode 0660)",
        "link.sock": f"the folder {folder} is for group {group} (mode 0750)",
    }
    try:
        for name, refused in cases.items():
            target = f"unix:{open_work}/{name}"
            said = (
                f"no runtime answers at {target}: permission denied: {refused}, and you "
                f"({nobody}, in groups: {nogroup}) are not in it; add yourself to group "
                f"{group} (sudo usermod -aG {group} {nobody}) and log in again, or run "
                f"newgrp {group}"
            )
            for command in (
                ["-m", "neuron_rtd.cli.neuron_cli", "-a", f"{open_work}/{name}", "list-model"],
                ["-m", "neuron_rtd.cli.neuron_ls", "-a", target],
                ["-c", f"from neuron_rtd.client import Client; Client({target!r}).version()"],
            ):
                done = subprocess.run(
                    [*as_other_user(), sys.executable, *command],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env={k: v for k, v in os.environ.items() if k != ADDRESS_ENV},
                )
                assert done.returncode == 1 and said in done.stderr, done.stderr
    finally:
        server.close()


def test_denied_tells_who_may_and_what_to_do(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the socket another group")
    me = pwd.getpwuid(os.geteuid()).pw_name
    nogroup = grp.getgrgid(OTHER_GID).gr_name
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(work / "n.sock"))
    sock.close()
    os.chown(work / "n.sock", -1, OTHER_GID)
    os.chmod(work / "n.sock", 0o660)
    assert f"usermod -aG {nogroup} {me}" in reach.denied(work / "n.sock")
    monkeypatch.setattr(reach, "_listed_in", lambda user, gid: True)  # added, not logged in
    assert reach.denied(work / "n.sock").endswith(
        f"are not in it in this login: you were added since; log in again, or run newgrp {nogroup}"
    )
    os.chmod(work / "n.sock", 0o600)
    assert f"(mode 0600) is open to its owner {me} only" in reach.denied(work / "n.sock")


def test_neuron_ls_with_no_machine_asks_the_default_daemon(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No address and no tree at the default root (the service's may be closed to this
    user): what the daemon at the default address says, not just 'start neuron-rtd'."""
    if os.geteuid() != 0:
        pytest.skip("the default root is the system's for root only")
    monkeypatch.delenv("NEURON_SIM_ROOT", raising=False)
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    monkeypatch.setattr("driver_sim.presets.SYSTEM_SIM_ROOT", work / "no-sim")
    monkeypatch.setattr(neuron_ls, "DEFAULT_ADDRESS", f"unix:{work}/none.sock")
    assert neuron_ls.main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"neuron-ls: no simulated machine at {work}/no-sim")
    assert f"and no runtime answers at unix:{work}/none.sock: no socket" in err


@pytest.mark.usefixtures("other_user")
def test_a_daemon_that_may_not_make_its_socket_folder_says_what_to_do(
    open_work: Path, no_settings: list[str]
) -> None:
    """As the package's daemon after a reboot without systemd: /run/neuron-rtd is gone
    and its user may not make it again."""
    (open_work / "empty.json").chmod(0o644)
    target = open_work / "gone" / "neuron.sock"
    daemon = [sys.executable, "-m", "neuron_rtd.daemon.main", *no_settings]
    done = subprocess.run(
        [*as_other_user(), *daemon, "-g", f"unix:{target}", "-x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NEURON_SIM_ROOT": str(open_work / "sim")},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot listen on unix:{target}: Permission denied on {open_work}" in done.stderr
    assert "systemd-tmpfiles --create /usr/lib/tmpfiles.d/neuron-rtd.conf" in done.stderr
