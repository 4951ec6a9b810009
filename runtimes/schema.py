"""Typed reads of JSON fields, for every artifact we load: a wrong type, an absurd size or a missing
field is one InputError naming the field, checked before the value is used. Device side: no numpy."""

from __future__ import annotations

import math
from typing import Any

from .errors import InputError

MAX_ELEMENTS = 2**26  # an observation or action of more than 64M numbers is not one we could run
MAX_DIMS = 8
MAX_TEXT = 4096

JSONObject = dict[str, Any]
"""a JSON object at the edge: as read (from a file, a device, a board's answer), before the typed result made
from it checks it, or as a typed result serializes; never passed on as a result"""
Event = JSONObject
"""one JSON line of the device runner (``python -m quarl_edge.runtimes``: progress, result, error)"""

MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)
"""what a field of the wrong type or size raises deep inside a reader: turned into one InputError"""


def obj(v: Any, where: str, fix: str) -> JSONObject:
    if not isinstance(v, dict):
        raise InputError(f"{where} is not an object ({type(v).__name__})", fix)
    return v


def text(v: Any, where: str, fix: str, max_len: int = MAX_TEXT) -> str:
    if not isinstance(v, str) or len(v) > max_len:
        raise InputError(f"{where} is not a string of at most {max_len} characters", fix)
    return v


def integer(v: Any, where: str, fix: str, lo: int | None = None, hi: int | None = None) -> int:
    if (
        isinstance(v, bool)
        or not isinstance(v, int)
        or (lo is not None and v < lo)
        or (hi is not None and v > hi)
    ):
        bounds = (
            f" in [{lo}, {hi}]"
            if lo is not None and hi is not None
            else f" >= {lo}"
            if lo is not None
            else ""
        )
        raise InputError(f"{where} is not an integer{bounds} ({str(v)[:40]!r})", fix)
    return v


def number(v: Any, where: str, fix: str, finite: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or (finite and not math.isfinite(float(v))):
        raise InputError(f"{where} is not a {'finite ' if finite else ''}number ({str(v)[:40]!r})", fix)
    return float(v)


def shape(v: Any, where: str, fix: str) -> tuple[int, ...]:
    if not isinstance(v, list | tuple) or len(v) > MAX_DIMS:
        raise InputError(f"{where} is not a list of at most {MAX_DIMS} sizes", fix)
    dims = tuple(integer(s, f"{where}[{i}]", fix, 0, MAX_ELEMENTS) for i, s in enumerate(v))
    if math.prod(dims) > MAX_ELEMENTS:
        raise InputError(f"{where} {list(dims)} has more than {MAX_ELEMENTS} elements", fix)
    return dims


def strings(v: Any, where: str, fix: str, max_items: int = 256) -> tuple[str, ...]:
    if not isinstance(v, list | tuple) or len(v) > max_items:
        raise InputError(f"{where} is not a list of at most {max_items} strings", fix)
    return tuple(text(s, f"{where}[{i}]", fix) for i, s in enumerate(v))
