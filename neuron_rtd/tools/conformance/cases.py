"""The corpus: every backend node test case onnx defines, the op each tests and its row
of the per-op table (`case_op`, `case_group`), the ops of it the NC library claims, and
the cases a run selects."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx

from driver_sim import KERNELS

DEFAULT_DOMAINS = ("", "ai.onnx")
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@functools.cache
def all_cases() -> tuple[Any, ...]:
    """Every backend node test case onnx defines (generated once, quietly)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


def _op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


@functools.cache
def _single_node_ops() -> dict[str, str]:
    """Case name -> op of every single-node case of the corpus."""
    return {
        case.name: _op_name(case.model.graph.node[0])
        for case in all_cases()
        if len(case.model.graph.node) == 1
    }


def case_op(case: Any) -> str | None:
    """The op a case tests: its single node's, or for a function expansion the op of the
    case it expands; None for a multi-node case with no single-node counterpart."""
    if _is_expansion(case):
        return _single_node_ops()[_EXPANDED.sub("", case.name)]
    nodes = case.model.graph.node
    return _op_name(nodes[0]) if len(nodes) == 1 else None


def _is_expansion(case: Any) -> bool:
    """A function expansion of a single-node case of the corpus (it may be one node:
    CastLike expands to one Cast)."""
    base = _EXPANDED.sub("", case.name)
    return base != case.name and base in _single_node_ops()


def case_group(case: Any) -> str:
    """The per-op table row of a case (see the package docstring)."""
    op = case_op(case)
    if op is not None:
        return f"{op} (expanded)" if _is_expansion(case) else op
    stem = _EXPANDED.sub("", case.name).removeprefix("test_")
    return f"(multi-node) {stem}"


def case_ops(case: Any) -> tuple[str, ...]:
    return tuple(sorted({_op_name(node) for node in case.model.graph.node}))


def claimed_ops(case: Any) -> tuple[str, ...]:
    """The case's ops that the NC library has a kernel for."""
    return tuple(
        sorted(
            {
                node.op_type
                for node in case.model.graph.node
                if node.domain in DEFAULT_DOMAINS and node.op_type in KERNELS
            }
        )
    )


def select_cases(
    cases: Iterable[Any], ops: Sequence[str] | None = None, match: str | None = None
) -> list[Any]:
    """The cases of these ops (single-node cases and their expansions) whose name holds
    `match`."""
    wanted = set(ops) if ops else None
    return [
        case
        for case in cases
        if (wanted is None or case_op(case) in wanted) and (not match or match in case.name)
    ]
