"""The Python client of neuron-rtd."""

from neuron_rtd.client.client import (
    DEFAULT_ADDRESS,
    Client,
    Model,
    NrtClientError,
    default_address,
)

__all__ = ["DEFAULT_ADDRESS", "Client", "Model", "NrtClientError", "default_address"]
