"""Products built on the layers below: `validate` (a NEFF on the daemon against its ONNX
model on onnxruntime) and `conformance` (the ONNX backend node cases through compile ->
load -> infer)."""
