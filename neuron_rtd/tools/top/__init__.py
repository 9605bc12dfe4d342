"""neuron-top's parts below its live view (`neuron_rtd/cli/neuron_top.py`): what one poll of
a daemon finds (`poll`) and how a poll is shown, as rich renderables (`frames`)."""
