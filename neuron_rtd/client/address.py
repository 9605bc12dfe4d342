"""What a user gives as the daemon's address, read one way by every command, the client
library and the daemon itself (`-g`): the gRPC target it names.

- `unix:/path`, `unix:///path` (gRPC's spellings) and `unix:relative`: a unix socket, its
  path made absolute (what a message names is then the file, wherever it was run from).
- A bare filesystem path: `/run/neuron.sock`, `./neuron.sock`, `~/n.sock`, or a name
  with no colon (`neuron.sock`): the same, `unix:<absolute path>`. A text with a colon
  and no slash is a path only when such a file exists (else it is `host:port`).
- `host:port` (`[::1]:50051`): TCP, as given.
- `unix-abstract:NAME` and gRPC's other schemes (`dns:`, `ipv4:`, `ipv6:`, `vsock:`): as
  given, for the client; the daemon listens only on a socket file or `host:port`.

`NEURON_RTD_ADDRESS` is read the same way, by the clients and by the daemon.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_rtd.client._config import ADDRESS_ENV as ADDRESS_ENV
from neuron_rtd.client._config import address_from_env

DEFAULT_ADDRESS = "unix:/run/neuron.sock"
UNIX = "unix:"
# gRPC's target schemes other than unix: passed through as they are
OTHER_SCHEMES = ("unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


class AddressError(ValueError):
    """A text that names no address: neither a socket path nor host:port."""


@dataclass(frozen=True)
class Address:
    """`target`: what gRPC dials (and the daemon binds): `unix:/absolute/path`,
    `host:port`, or another gRPC target as given."""

    target: str
    unix_path: Path | None = None  # the socket file of a unix address
    host_port: bool = False  # a plain TCP host:port

    def __str__(self) -> str:
        return self.target


def parse_address(text: str) -> Address:
    """The address `text` names (see the module's doc); AddressError when it names none."""
    if not text:
        raise AddressError("an empty address: give a socket path (/run/neuron.sock) or host:port")
    if text.startswith(UNIX):
        return _unix(text[len(UNIX) :], text)
    if text.startswith(OTHER_SCHEMES):
        return Address(text)
    if "/" in text or ":" not in text:
        return _unix(text, text)
    if _host_port(text):
        return Address(text, host_port=True)
    if os.path.lexists(text):
        return _unix(text, text)
    raise AddressError(
        f"address '{text}' is neither a socket path (/run/neuron.sock, ./neuron.sock, "
        "unix:PATH) nor host:port, and no file of that name is here"
    )


def grpc_target(text: str) -> str:
    """The gRPC target `text` names (AddressError when it names none)."""
    return parse_address(text).target


def default_address(environ: Mapping[str, str] | None = None) -> str:
    """The gRPC target of `NEURON_RTD_ADDRESS`, else of DEFAULT_ADDRESS; AddressError
    naming the variable when it names no address."""
    text = address_from_env(environ)
    if not text:
        return DEFAULT_ADDRESS
    try:
        return grpc_target(text)
    except AddressError as exc:
        raise AddressError(f"${ADDRESS_ENV}: {exc}") from None


def lock_path(socket_path: Path) -> Path:
    """The file a daemon holds locked (flock) for as long as it serves `socket_path`:
    held, a daemon is there even before its socket is (daemon/listener.py)."""
    return socket_path.with_name(socket_path.name + ".lock")


def _unix(path: str, text: str) -> Address:
    if path.startswith("//"):  # unix:///abs: gRPC's "unix://" + an absolute path
        path = path[2:]
        if not path.startswith("/"):
            raise AddressError(
                f"unix address '{text}': after unix:// comes an absolute path, as in "
                "unix:///run/neuron.sock"
            )
    if not path:
        raise AddressError(f"unix address '{text}' names no path")
    absolute = Path(os.path.abspath(os.path.expanduser(path)))
    return Address(f"{UNIX}{absolute}", unix_path=absolute)


def _host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit())
