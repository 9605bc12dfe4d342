"""The compiler's one error: what could not be compiled, naming the node and op."""

from __future__ import annotations


class CompileError(Exception):
    """The model cannot be compiled. `node` and `op` name the culprit where there is one."""

    def __init__(self, reason: str, *, node: str = "", op: str = "") -> None:
        self.reason = reason
        self.node = node
        self.op = op
        where = f"node {node!r} ({op}): " if node or op else ""
        super().__init__(f"{where}{reason}")
