"""The Python client of neuron-rtd: the framework-plugin side of the wire API.

`with Client() as client:` connects to `NEURON_RTD_ADDRESS` (or unix:/run/neuron.sock;
`Client("/tmp/neuron.sock")` to another daemon);
`model = client.load("model.neff")` loads a NEFF; `model(x=array)` answers the outputs
as a dict of numpy arrays.
"""

from neuron_rtd.client._config import NCG_SIZES_ENV, parse_ncg_sizes
from neuron_rtd.client.address import DEFAULT_ADDRESS, AddressError, default_address
from neuron_rtd.client.client import Client
from neuron_rtd.client.errors import NrtClientError, NrtConnectionError
from neuron_rtd.client.model import Model, Staged

__all__ = [
    "DEFAULT_ADDRESS",
    "NCG_SIZES_ENV",
    "AddressError",
    "Client",
    "Model",
    "NrtClientError",
    "NrtConnectionError",
    "Staged",
    "default_address",
    "parse_ncg_sizes",
]
