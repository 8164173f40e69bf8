"""The language's element types, one row each: every stage reads its facts here (a leaf module,
the standard library only, so that the syntax, the checker, the lowering and the run time share it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Element:
    name: str  # as the language writes it: f32
    torch: str  # torch's dtype attribute: float32
    bytes: int  # per value, for the DeviceTable's sizes
    kind: str  # float | int | bool
    largest: float  # the largest magnitude it holds: torch refuses to fill a tensor beyond it


ELEMENTS: dict[str, Element] = {e.name: e for e in (
    Element("f16", "float16", 2, "float", 65504.0),
    Element("bf16", "bfloat16", 2, "float", 3.3895313892515355e38),
    Element("f32", "float32", 4, "float", 3.4028234663852886e38),
    Element("f64", "float64", 8, "float", float("inf")),
    Element("i32", "int32", 4, "int", 2.0 ** 31 - 1),
    Element("i64", "int64", 8, "int", 2.0 ** 63 - 1),
    Element("bool", "bool", 1, "bool", float("inf")),
)}

FLOAT_DTYPES = tuple(n for n, e in ELEMENTS.items() if e.kind == "float")
INT_DTYPES = tuple(n for n, e in ELEMENTS.items() if e.kind == "int")
DTYPES = tuple(ELEMENTS)
