"""Every runtime exception maps to an nerr value of the wire API."""

from __future__ import annotations

from neuron_rtd.errors import Nerr, NrtError, all_error_classes
from neuron_rtd.proto import pb


def test_nerr_matches_the_wire_enum() -> None:
    wire = {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name["nerr"].values}
    assert {f"NERR_{e.name}": e.value for e in Nerr} == wire


def test_every_exception_has_a_wire_code() -> None:
    wire = {v.number for v in pb.DESCRIPTOR.enum_types_by_name["nerr"].values}
    classes = all_error_classes()
    assert len(classes) > 10
    for cls in classes:
        assert issubclass(cls, NrtError)
        assert cls.code in wire, cls
        assert cls.code != Nerr.OK, cls
        assert str(cls("what went wrong")) == "what went wrong"
