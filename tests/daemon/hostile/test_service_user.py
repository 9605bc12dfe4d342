"""The daemon as the unit runs it: its own unprivileged user, in the socket's group, with
no capabilities, writing only in its runtime folder; and what it trusts of its config
file and of its listening address.

The unit's ExecStart, User, Group, UMask and RuntimeDirectory are read from
systemd/neuron-rtd.service; the package's config and tmpfiles.d file are laid out under
a temporary /run. The tests run as root: the daemon runs under `setpriv` as a stand-in
for the package's user (nobody, group nogroup: neither exists only for this test)."""

from __future__ import annotations

import contextlib
import grp
import importlib.util
import json
import os
import pwd
import queue
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_systemd_units import installed_daemon, tmpfiles_lines, unit_settings

from neuron_rtd.cli.spawn import NotifyListener
from neuron_rtd.client import Client
from neuron_rtd.daemon import config as daemon_config
from neuron_rtd.daemon.config import load_config, remote_clients_warning
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.typed_json import ConfigError

ROOT = Path(__file__).resolve().parents[3]
UNIT = "neuron-rtd.service"
STAND_IN_UID = 65534  # nobody: the package's neuron-rtd is not made on a test machine
STAND_IN_GID = 65534  # nogroup, standing in for neuron
OTHER_UID = 65533  # another member of the socket's group, and a stranger to it


def build_deb_module() -> Any:
    spec = importlib.util.spec_from_file_location("build_deb", ROOT / "packaging/build_deb.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_user(uid: int, gid: int, *groups: int) -> list[str]:
    """setpriv as the unit's settings make the daemon: no capabilities, no new ones."""
    group_args = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        *group_args,
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


@dataclass
class Service:
    run: Path  # stands for /run
    proc: subprocess.Popen[bytes]
    notify: NotifyListener
    log: Path

    def path(self, system_path: str) -> Path:
        """Where a path under /run, or the package's /var/lib/neuron-rtd, is in this test."""
        return Path(moved(system_path, self.run))


def moved(text: str, run: Path) -> str:
    """The system paths in `text` as this test lays them out: /run/X under `run`, and
    /var/lib/neuron-rtd/X beside it."""
    return text.replace("/var/lib/neuron-rtd/", f"{run.parent}/var-lib/").replace(
        "/run/", f"{run}/"
    )


def model_repository(top: Path, models: Mapping[str, bytes]) -> Path:
    """A model repository in `top/repo` holding each model's NEFF as its version 1, all
    of it readable by the daemon's user (`top` too may be entered)."""
    top.chmod(0o755)
    repository = top / "repo"
    for name, neff in models.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.neff").write_bytes(neff)
    for path in [repository, *repository.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repository


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    with unit_service() as started:
        yield started


@contextlib.contextmanager
def unit_service(*args: str) -> Iterator[Service]:
    """The daemon as the unit starts it, with `args` after the unit's (`--model-repository
    DIR`, say); stopped (SIGTERM) on leaving."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run the daemon as another user")
    settings = unit_settings(UNIT)
    assert (settings["User"], settings["Group"]) == (["neuron-rtd"], ["neuron"])
    probe = subprocess.run(
        [*as_user(STAND_IN_UID, STAND_IN_GID), sys.executable, "-c", "import neuron_rtd"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"uid {STAND_IN_UID} cannot run this environment's Python: {probe.stderr}")
    top = Path(tempfile.mkdtemp(prefix="nrtd-user-"))
    top.chmod(0o755)
    run = top / "run"
    run.mkdir(mode=0o755)
    # what systemd makes for the unit: its RuntimeDirectory, of its mode, owned by the user
    (runtime,) = settings["RuntimeDirectory"]
    folder = run / runtime
    folder.mkdir()
    folder.chmod(int(settings["RuntimeDirectoryMode"][0], 8))
    os.chown(folder, STAND_IN_UID, STAND_IN_GID)
    # and what the package's tmpfiles.d makes: the links into it, the folder of NEFF files
    for line in tmpfiles_lines():
        if line[0].startswith("L"):
            (run / Path(line[1]).relative_to("/run")).symlink_to(moved(line[6], run))
        elif line[0] == "d" and not line[1].startswith("/run/"):
            made = Path(moved(line[1], run))
            made.mkdir(parents=True)
            os.chown(made, 0, STAND_IN_GID)  # root, group neuron (the stand-in's)
            made.chmod(int(line[2], 8))
            made.parent.chmod(0o755)
    # the package's config, its paths under this /run, the socket for the stand-in group
    build_deb = build_deb_module()
    packaged = json.loads(build_deb.packaged_config(ROOT / "config" / "neuron-rtd.json"))
    assert packaged["socket_group"] == "neuron"
    packaged["socket_group"] = grp.getgrgid(STAND_IN_GID).gr_name
    config = top / "neuron-rtd.json"
    config.write_text(moved(json.dumps(packaged), run))
    config.chmod(0o644)
    command = shlex.split(settings["ExecStart"][0])
    assert command[0] == "/usr/bin/neuron-rtd" and command[1:] == [
        "-c",
        "/etc/neuron-rtd/neuron-rtd.json",
    ]
    command = [installed_daemon(), "-c", str(config), *args]
    notify = NotifyListener(top)
    os.chmod(notify.path, 0o666)  # systemd's notify socket: any service may send to it
    env = {  # systemd's environment for the service
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "NOTIFY_SOCKET": notify.path,
        "WATCHDOG_USEC": "2000000",
        "RUNTIME_DIRECTORY": str(folder),
    }
    log = top / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*as_user(STAND_IN_UID, STAND_IN_GID), *command],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            umask=int(settings["UMask"][0], 8),
        )
    try:
        ready = notify.wait_for("READY=1", 60, alive=lambda: proc.poll() is None)
        assert ready, f"no READY=1 (exit {proc.poll()}):\n{log.read_text()}"
        yield Service(run, proc, notify, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        notify.close()
        shutil.rmtree(top, ignore_errors=True)


def status_fields(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


@pytest.mark.daemon
def test_it_runs_as_the_user_with_no_capability(service: Service) -> None:
    fields = status_fields(service.proc.pid)
    assert fields["Uid"].split() == [str(STAND_IN_UID)] * 4
    assert fields["Gid"].split() == [str(STAND_IN_GID)] * 4
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[caps], 16) == 0, caps
    assert fields["NoNewPrivs"] == "1"


@pytest.mark.daemon
def test_its_socket_and_tree_are_its_groups_only(service: Service) -> None:
    main = json.loads((ROOT / "config" / "neuron-rtd.json").read_text())
    sock = service.path(main["server_address"].removeprefix("unix:"))
    info = sock.stat()
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660
    assert (info.st_uid, info.st_gid) == (STAND_IN_UID, STAND_IN_GID)
    assert Path(f"{sock}.lock").exists()  # the listener's lock, beside the socket
    tree = service.path(main["sim"]["root"])
    assert (tree / "machine.json").is_file()
    for path in [tree, *tree.rglob("*")]:
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (STAND_IN_UID, STAND_IN_GID), path
        # the daemon writes it, its group reads it (neuron-ls), others see nothing of it
        # under the runtime folder (0750); the unit's umask keeps the group from writing
        assert info.st_mode & 0o022 == 0 and info.st_mode & 0o040, (path, oct(info.st_mode))


@pytest.mark.daemon
def test_it_serves_through_the_link_clients_know(service: Service) -> None:
    """The clients' default address /run/neuron.sock is the package's link to the socket
    in the runtime folder: connect() follows it. The demo's flow, on a small model."""
    address = f"unix:{service.path('/run/neuron.sock')}"
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    sample = build_mlp((64, 32, 10), name="unprivileged")
    with Client(address) as client:
        assert client.version()
        model = client.load(sample.neff)  # streamed
        want = model.infer(sample.random_inputs(0))
        posted = [model.infer_async(sample.random_inputs(0)) for _ in range(8)]
        for future in posted:
            assert (future.result()["probs"] == want["probs"]).all()
        model.unload()
    assert service.notify.wait_for("WATCHDOG=1", 10), service.notify.messages


def test_a_client_of_the_original_interface_works_as_documented(service: Service) -> None:
    """A client generated from the original interface, as docs/wire-api.md says it drives
    the packaged daemon: a session, a streamed load, inline inference, and shared memory
    by name on an object the daemon's user may open (here through its group), named by
    calls that present no session (through the model's session)."""
    sample = build_mlp((16, 8, 4), name="original")
    x = sample.random_inputs(0)["x"]
    address = f"unix:{service.path('/run/neuron.sock')}"
    name = f"/nrt_original_{os.getpid()}"
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.nmgr_v1Stub(channel)
        requests: queue.Queue[Any] = queue.Queue()
        requests.put(pb.session_monitor_request(framework_name="original"))
        sessions = pb_grpc.nmgr_session_managerStub(channel)
        stream = sessions.session_monitor(iter(requests.get, None))
        session = next(stream).session_id
        chunks = [pb.load_request(session_id=session), pb.load_request(neff_size=len(sample.neff))]
        chunks += [
            pb.load_request(neff_chunk=pb.file_chunk(chunk=sample.neff[i : i + (1 << 20)]))
            for i in range(0, len(sample.neff), 1 << 20)
        ]
        loaded = stub.load(iter(chunks), timeout=60)
        assert loaded.status.code == Nerr.OK, loaded.status
        inline = pb.infer_request(h_nn=loaded.h_nn)
        inline.ifmap.add(name="x", buf=x.tobytes())
        answer = stub.infer(inline, timeout=60)
        assert answer.status.code == Nerr.OK, answer.status
        want = answer.ofmap[0].buf
        fd = os.open(f"/dev/shm/{name[1:]}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.fchown(fd, -1, STAND_IN_GID)  # docs: let the daemon's user open it
            os.fchmod(fd, 0o660)
            os.ftruncate(fd, 4096)
            os.pwrite(fd, x.tobytes(), 0)
            mapped = stub.shm_map(pb.shm_map_request(path=name, mmap_prot=3, session_id=session))
            assert mapped.status.code == Nerr.OK, mapped.status
            os.unlink(f"/dev/shm/{name[1:]}")
            request = pb.infer_request(h_nn=loaded.h_nn)
            request.ifmap.add(name="x", buf_shm=pb.shared_mem_buf(path=name))
            request.shm_ofmap.add(name="probs", buf_shm=pb.shared_mem_buf(path=name))
            answer = stub.infer(request, timeout=60)
            assert answer.status.code == Nerr.OK, answer.status
            assert os.pread(fd, len(want), 0) == want
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name[1:]}")
        requests.put(None)  # the session ends: the daemon unloads the model
        assert list(stream) == []
        gone = stub.start(pb.start_request(h_nn=loaded.h_nn), timeout=60)
        assert gone.status.code == Nerr.INVALID_HANDLE


def neuron_ls(service: Service, uid: int, gid: int, *groups: int) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "NEURON_SIM_ROOT": str(service.path("/run/neuron-sim"))}
    return subprocess.run(
        [*as_user(uid, gid, *groups), sys.executable, "-m", "neuron_rtd.cli.neuron_ls", "-j"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.daemon
def test_its_group_reads_the_machine_and_no_one_else(service: Service) -> None:
    member = neuron_ls(service, OTHER_UID, OTHER_UID, STAND_IN_GID)
    assert member.returncode == 0, member.stderr
    devices = json.loads(member.stdout)
    assert devices and all(d["runtime"]["pid"] == service.proc.pid for d in devices), devices
    stranger = neuron_ls(service, OTHER_UID, OTHER_UID)
    assert stranger.returncode != 0 and not stranger.stdout, stranger.stdout


@pytest.mark.daemon
def test_it_stops_on_sigterm_and_removes_its_socket(service: Service) -> None:
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(30) == 0, service.log.read_text()
    assert not service.path("/run/neuron-rtd/neuron.sock").exists()
    assert service.path("/run/neuron-sim/machine.json").exists()  # the machine outlives it


# --- what the daemon trusts of its config file ----------------------------------------


def e(path: Path) -> str:
    return re.escape(str(path))


def write_config(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    path.write_text('{"log_level": "debug"}\n')
    path.chmod(mode)
    os.chown(path, uid, gid)
    return path


@pytest.fixture
def folder() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to give files to other users")
    path = Path(tempfile.mkdtemp(prefix="nrtd-config-"))
    yield path
    shutil.rmtree(path)


def test_a_config_others_may_write_is_refused(folder: Path) -> None:
    world = write_config(folder / "world.json", 0o666)
    with pytest.raises(ConfigError, match=rf"{e(world)} is writable by others.*go-w {e(world)}"):
        load_config(path=str(world))
    shared = write_config(folder / "group.json", 0o664, gid=STAND_IN_GID)  # a shared group
    with pytest.raises(ConfigError, match=rf"chmod go-w {e(shared)}"):
        load_config(path=str(shared))
    # a group of the owner alone (a user private group, Debian's default) is the owner
    root_group = grp.getgrgid(0)
    if root_group.gr_name == pwd.getpwuid(0).pw_name and not set(root_group.gr_mem) - {"root"}:
        assert load_config(path=str(write_config(folder / "own.json", 0o664))).log_level == "debug"
    assert load_config(path=str(write_config(folder / "ok.json", 0o644))).log_level == "debug"


def test_a_config_of_another_user_is_refused(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = write_config(folder / "theirs.json", 0o644, uid=STAND_IN_UID)
    with pytest.raises(ConfigError, match=rf"{e(theirs)} belongs to .*chown root {e(theirs)}"):
        load_config(path=str(theirs))
    # the daemon's own user may own it (a daemon started by hand, its file in its home)
    monkeypatch.setattr(daemon_config.os, "geteuid", lambda: STAND_IN_UID)
    assert load_config(path=str(theirs)).log_level == "debug"


# --- a TCP address beyond this machine ------------------------------------------------


@pytest.fixture
def empty_config(tmp_path: Path) -> str:
    """A config of no settings (not whatever /etc/neuron-rtd holds on this machine)."""
    path = tmp_path / "empty.json"
    path.write_text("{}\n")
    path.chmod(0o644)
    return str(path)


@pytest.mark.parametrize(
    "address", ["unix:/run/x.sock", "127.0.0.1:50051", "127.1.2.3:1", "[::1]:50051", "localhost:1"]
)
def test_local_addresses_need_no_setting_and_warn_of_nothing(
    address: str, empty_config: str
) -> None:
    config = load_config(path=empty_config, overrides={"server_address": address})
    assert remote_clients_warning(config) is None


@pytest.mark.parametrize("address", ["0.0.0.0:50051", "[::]:50051", "10.0.0.5:1", "host:1"])
def test_a_remote_address_needs_allow_remote_clients_and_warns(
    address: str, empty_config: str
) -> None:
    with pytest.raises(ConfigError, match=r"not a loopback address.*allow_remote_clients"):
        load_config(path=empty_config, overrides={"server_address": address})
    allowed = {"server_address": address, "allow_remote_clients": True}
    warning = remote_clients_warning(load_config(path=empty_config, overrides=allowed))
    assert warning and address in warning and "plaintext" in warning


def test_allow_remote_clients_is_a_config_key(tmp_path: Path) -> None:
    path = tmp_path / "remote.json"
    path.write_text(json.dumps({"server_address": "0.0.0.0:50051"}))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"{e(path)}: server_address 0\.0\.0\.0:50051 is not"):
        load_config(path=str(path))
    path.write_text(json.dumps({"server_address": "0.0.0.0:50051", "allow_remote_clients": True}))
    assert load_config(path=str(path)).allow_remote_clients


@pytest.mark.daemon
def test_the_daemon_refuses_a_remote_address_without_the_setting(empty_config: str) -> None:
    done = subprocess.run(
        [installed_daemon(), "-c", empty_config, "-g", "0.0.0.0:50051"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "allow_remote_clients" in done.stderr, done.stderr
