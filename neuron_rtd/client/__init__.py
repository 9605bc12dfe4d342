"""The Python client of neuron-rtd: the framework-plugin side of the wire API.

`with Client() as client:` connects to `NEURON_RTD_ADDRESS` (or unix:/run/neuron.sock;
`Client("/tmp/neuron.sock")` to another daemon);
`model = client.load("model.neff")` loads a NEFF; `model(x=array)` answers the outputs
as a dict of numpy arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_rtd import lazy

if TYPE_CHECKING:
    from neuron_rtd.client._config import NCG_SIZES_ENV, parse_ncg_sizes
    from neuron_rtd.client._slots import Staged
    from neuron_rtd.client.address import DEFAULT_ADDRESS, AddressError, default_address
    from neuron_rtd.client.client import Client
    from neuron_rtd.client.errors import (
        DaemonStopping,
        DaemonTimeout,
        NrtClientError,
        NrtConnectionError,
    )
    from neuron_rtd.client.model import Model

# Each name and its module, imported when the name is first asked for: a tool that needs
# only `neuron_rtd.client.address` or `.observe` (neuron-ls, neuron-monitor, neuron-cli's
# listings) does not import the client and numpy with it.
_WHERE = {
    "NCG_SIZES_ENV": "_config",
    "parse_ncg_sizes": "_config",
    "DEFAULT_ADDRESS": "address",
    "AddressError": "address",
    "default_address": "address",
    "Client": "client",
    "DaemonStopping": "errors",
    "DaemonTimeout": "errors",
    "NrtClientError": "errors",
    "NrtConnectionError": "errors",
    "Model": "model",
    "Staged": "_slots",
}


__getattr__ = lazy.lazy_names(__name__, _WHERE)


__all__ = [
    "DEFAULT_ADDRESS",
    "NCG_SIZES_ENV",
    "AddressError",
    "Client",
    "DaemonStopping",
    "DaemonTimeout",
    "Model",
    "NrtClientError",
    "NrtConnectionError",
    "Staged",
    "default_address",
    "parse_ncg_sizes",
]
