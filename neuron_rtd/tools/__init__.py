"""Products built on the layers below: `validate` (a NEFF on the daemon against its ONNX
model on onnxruntime), `control` (neuron-cli's NCG, model and inference commands) and
`conformance` (the ONNX backend node cases through compile -> load -> infer)."""
