"""One case through onnxruntime: the onnxruntime column of the report (`pass`, `fail`,
`unsupported`), a model of too new an IR version retried with the least its opsets need."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from neuron_rtd import onnxrt
from neuron_rtd.tools.conformance.compare import _clip, _error_text, _value, compare_outputs
from neuron_rtd.tools.conformance.results import ORT_FAIL, ORT_PASS, ORT_UNSUPPORTED


def _ort_session(model: onnx.ModelProto) -> Any:
    try:
        return onnxrt.session(model, log_severity=onnxrt.LOG_SILENT)
    except Exception as exc:
        if "IR version" not in str(exc):
            raise
    lowered = onnx.ModelProto()
    lowered.CopyFrom(model)
    lowered.ir_version = helper.find_min_ir_version_for(
        list(model.opset_import), ignore_unknown=True
    )
    return onnxrt.session(lowered, log_severity=onnxrt.LOG_SILENT)


def run_onnxruntime(case: Any) -> tuple[str, str]:
    """onnxruntime's outcome on a case and the reason (empty for a pass)."""
    try:
        session = _ort_session(case.model)
    except Exception as exc:
        return ORT_UNSUPPORTED, _error_text(exc)
    try:
        names = [i.name for i in session.get_inputs()]
        for inputs, expected in case.data_sets:
            feeds = dict(zip(names, [_value(x) for x in inputs], strict=False))
            got = session.run(None, feeds)
            compare_outputs(got, [_value(x) for x in expected], case.rtol, case.atol)
    except AssertionError as exc:
        return ORT_FAIL, _clip(str(exc))
    except Exception as exc:
        return ORT_FAIL, f"{type(exc).__name__}: {_error_text(exc)}"
    return ORT_PASS, ""
