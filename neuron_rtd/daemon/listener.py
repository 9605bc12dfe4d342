"""The daemon's listening address, and exclusive use of a unix socket path.

grpcio would silently take a unix path over from a live daemon, so before binding we
hold `<path>.lock` (flock, released by the kernel if we die) and check that nothing
answers on the path; a stale socket file is removed. The socket is created group-only.

The lock file lives exactly as long as its holder: it is removed, while still locked, when
the daemon stops or is refused. A daemon that locked a file someone removed meanwhile
(the path no longer names what it holds) opens the path again. A daemon killed with
SIGKILL leaves its file, unlocked, and the next one takes it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import socket
from pathlib import Path
from typing import IO

import grpc

from neuron_rtd.client.address import Address, lock_path, parse_address
from neuron_rtd.client.address import AddressError as ClientAddressError


class ListenError(Exception):
    """An address we cannot serve on, or one another daemon already serves."""


def listen_address(text: str) -> Address:
    """Where to listen, read as every tool reads an address (a socket path, `unix:/path`
    or `host:port`: client/address.py), and one a daemon can serve: a socket file or a
    TCP port, not an abstract socket or a name to resolve."""
    try:
        address = parse_address(text)
    except ClientAddressError as exc:
        raise ListenError(str(exc)) from None
    if address.unix_path is None and not address.host_port:
        raise ListenError(
            f"neuron-rtd listens on a socket path (/run/neuron.sock, unix:/path) or on "
            f"host:port, not on '{text}'"
        )
    return address


def _answers(path: Path) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        sock.close()


def _names(path: Path, file: IO[str]) -> bool:
    """Whether `path` still names the open `file` (and not a removed or new one)."""
    try:
        on_disk = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(file.fileno())
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


class UnixListener:
    """Holds the socket path for this process from `claim()` to `close()`."""

    def __init__(self, path: Path, *, mode: int, group: str | None) -> None:
        self.path = path
        self.lock_path = lock_path(path)
        self.mode = mode
        self.group = group
        self._lock: IO[str] | None = None
        self._inode: int | None = None

    def claim(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = self._take_lock()
        except PermissionError as exc:  # a folder the daemon's user may not write
            raise ListenError(
                f"cannot listen on unix:{self.path}: {exc.strerror} on "
                f"{exc.filename or self.path.parent}: let this user write that folder (for "
                "the package after a reboot without systemd: systemd-tmpfiles --create "
                "/usr/lib/tmpfiles.d/neuron-rtd.conf, or dpkg-reconfigure neuron-rtd), or "
                "listen elsewhere (-g ADDRESS)"
            ) from None
        try:
            if self.path.exists() or self.path.is_symlink():
                if _answers(self.path):
                    raise ListenError(f"a live server already answers on unix:{self.path}")
                self.path.unlink()
        except BaseException:
            self._drop_lock()
            raise
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"{os.getpid()}\n")
        self._lock.flush()

    def _take_lock(self) -> IO[str]:
        """The lock file, locked by us; ListenError naming the holder if it is held."""
        while True:
            lock = open(self.lock_path, "a+")  # noqa: SIM115 - held for the process's life
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                owner = lock.read().strip() or "unknown"
                lock.close()
                raise ListenError(
                    f"another neuron-rtd (pid {owner}) already serves unix:{self.path}"
                ) from None
            if _names(self.lock_path, lock):
                return lock
            lock.close()  # its holder removed it as we opened it: open the path again

    def _drop_lock(self) -> None:
        """Remove the lock file while we still hold it, then let it go."""
        if self._lock is None:
            return
        if _names(self.lock_path, self._lock):
            with contextlib.suppress(FileNotFoundError):
                self.lock_path.unlink()
        self._lock.close()
        self._lock = None

    def bind(self, server: grpc.Server) -> None:
        old = os.umask(0o777 & ~self.mode)
        try:
            port = server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as exc:
            raise ListenError(f"cannot listen on unix:{self.path}: {exc}") from exc
        finally:
            os.umask(old)
        if port == 0:
            raise ListenError(f"cannot listen on unix:{self.path}")

    @property
    def peer_socket_path(self) -> Path:
        """Where clients pass shared memory objects (`server/peer_socket.py`): beside
        the socket, under the same lock."""
        return self.path.with_name(self.path.name + ".peer")

    def gid(self) -> int | None:
        """The id of `socket_group` (None: the daemon's own group)."""
        if not self.group:
            return None
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise ListenError(f"socket_group '{self.group}' does not exist") from None

    def finish(self) -> None:
        """Fix mode and group once the server started (the socket file exists then)."""
        os.chmod(self.path, self.mode)
        self.give_to_group(self.path)
        self._inode = self.path.stat().st_ino

    def give_to_group(self, path: Path) -> None:
        """Chown `path` to `socket_group` (ListenError if the daemon may not)."""
        gid = self.gid()
        if gid is None or path.stat().st_gid == gid:
            return
        try:
            os.chown(path, -1, gid)
        except OSError as exc:
            raise ListenError(
                f"cannot give {path} to socket_group '{self.group}' ({exc.strerror}): run "
                "the daemon in that group, as the unit does (Group=)"
            ) from None

    def close(self) -> None:
        """Remove the socket if it is still ours, then the lock file."""
        if self._lock is None:
            return
        with contextlib.suppress(OSError):
            if self._inode is not None and self.path.stat().st_ino == self._inode:
                self.path.unlink()
        self._drop_lock()


def bind_tcp(server: grpc.Server, address: Address) -> None:
    try:
        port = server.add_insecure_port(address.target)
    except RuntimeError as exc:
        raise ListenError(f"cannot listen on {address.target}: {exc}") from exc
    if port == 0:
        raise ListenError(f"cannot listen on {address.target}")


def bind_also(server: grpc.Server, address: str) -> str:
    """TCP `address` ("HOST:PORT"; port 0: any free one) bound on `server` besides its own
    address: "HOST:PORT" as bound; ListenError saying why it cannot be (in use, not this
    machine's, a privileged port)."""
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # grpc's words only point at its debug log
        port = 0
    if port == 0:
        raise ListenError(f"cannot serve gRPC on {address}: {_why_not_bound(address)}")
    return f"{address.rpartition(':')[0]}:{port}"


def _why_not_bound(address: str) -> str:
    """Why `address` cannot be listened on, as the HTTP front says it: asked of a socket
    of our own bound there (and closed at once)."""
    from neuron_rtd.server import bind  # the HTTP front's (waitress's) modules: only now

    try:
        probe, _ = bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    probe.close()
    return "gRPC could not bind it (GRPC_VERBOSITY=debug tells why)"
