"""TFRecord files and tf.train.Example feature specs: records read from their frames
(`tfrecord`: CRCs, compression, indexes, the writer) and Examples decoded into a model's
input arrays by a spec per input (`features`: `--feature NAME:DTYPE:D0,D1[:raw|list|image]`);
and npz files of named arrays, read one way (`npz`: `neuron-cli infer` and `validate`'s
inputs, `neuron-cc quantize`'s calibration samples).

Read by neuron-batch's stream (`neuron_rtd.tools.stream`) and by `neuron-cc quantize`'s
calibration (`neuron_rtd.compiler`); it imports only the NEFF format and the wire's
generated messages, so both layers may use it.
"""
