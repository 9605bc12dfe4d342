"""neuron_rtd._generated.deviceplugin: GENERATED CODE -- DO NOT EDIT.

Python code of the wire API, compiled from the .proto files under proto/ by grpc_tools
(neuron_rtd/protogen.py). Edit the .proto files, never these, and regenerate with:

    python -m neuron_rtd.protogen

``python -m neuron_rtd.protogen --check`` (run by the tests) fails when this drifts.
"""
