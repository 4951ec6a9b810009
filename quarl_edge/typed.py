"""Typed results at the JSON edge: range checks for their numbers, and the one way they become JSON and are
read back (bench and fleet reports, study rows, ActorQ run logs).

Each result is a frozen dataclass whose ``__post_init__`` calls the checks below, so a number outside its
meaning (an agreement of 7.0, a p99 of -5 us, a reward drop of -inf) is refused both where the result is
made and where it is read back. The checks raise ValueError naming the field; ``load`` turns that into one
InputError naming the file and the fix. ``to_json`` is the writer's side: a result as plain JSON values,
non-finite floats as null (NaN and inf are not JSON).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from quarl_edge.runtimes import schema
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

T = TypeVar("T")
Parse = Callable[[Any, str], Any]
"""a field's reader: (raw JSON value, its name for errors) -> its typed value"""

OMIT_NONE = {"omit_none": True}
"""dataclass field metadata: the key is left out of the JSON when the value is None (an optional block)"""


# ---- range checks ------------------------------------------------------------------------------------


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def number(v: object, name: str, lo: float | None = None, hi: float | None = None) -> float:
    """``v`` as a finite number in [lo, hi] (NaN and inf never pass)."""
    if not _is_number(v):
        raise ValueError(f"{name} is not a number ({str(v)[:40]!r})")
    x = float(v)  # type: ignore[arg-type]
    if not math.isfinite(x):
        raise ValueError(f"{name} is {x}, not a finite number")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        span = (
            f"[{lo:g}, {hi:g}]"
            if lo is not None and hi is not None
            else f">= {lo:g}"
            if lo is not None
            else f"<= {hi:g}"
        )
        raise ValueError(f"{name} is {x:g}, outside {span}")
    return x


def opt_number(v: object, name: str, lo: float | None = None, hi: float | None = None) -> float | None:
    """``number``, or None: a figure that was not measured."""
    return None if v is None else number(v, name, lo, hi)


def integer(v: object, name: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} is not an integer {span} ({str(v)[:40]!r})")
    return v


def text(v: object, name: str, max_len: int = schema.MAX_TEXT) -> str:
    """A non-empty (not only blank) string of at most ``max_len`` characters."""
    if not isinstance(v, str) or not v.strip() or len(v) > max_len:
        raise ValueError(
            f"{name} is not a non-empty string of at most {max_len} characters ({str(v)[:40]!r})"
        )
    return v


def opt_text(v: object, name: str, max_len: int = schema.MAX_TEXT) -> str | None:
    return None if v is None else text(v, name, max_len)


def flag(v: object, name: str) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name} is not true or false ({str(v)[:40]!r})")
    return v


def first_twice(names: Iterable[str]) -> str | None:
    """The first name given twice (a second result of the same name would go unchecked), or None."""
    seen: set[str] = set()
    for n in names:
        if n in seen:
            return n
        seen.add(n)
    return None


# ---- reading JSON into a result ----------------------------------------------------------------------


def obj(v: object, name: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{name} is not an object ({type(v).__name__})")
    return v


def items(v: object, name: str, max_items: int = 10_000_000) -> tuple[Any, ...]:
    if not isinstance(v, list | tuple):
        raise ValueError(f"{name} is not a list ({type(v).__name__})")
    if len(v) > max_items:
        raise ValueError(f"{name} has more than {max_items} items")
    return tuple(v)


def optional(parse: Parse) -> Parse:
    """``parse`` for a field that may be null."""
    return lambda v, name: None if v is None else parse(v, name)


def tuple_of(parse: Parse) -> Parse:
    return lambda v, name: tuple(parse(x, f"{name}[{i}]") for i, x in enumerate(items(v, name)))


def build(cls: Callable[..., T], v: object, name: str, parse: Mapping[str, Parse] | None = None) -> T:
    """The dataclass ``cls`` from the JSON object ``v``: each field from its key (a field without a default
    must be there, its value may be null), read by ``parse[field]`` (given the name ``"<name> <field>"``)
    when given, a list as a tuple; the class's own ``__post_init__`` checks the values, and what it refuses
    is named ``"<name>: ..."``. Keys that are not fields are left out."""
    d = obj(v, name)
    kwargs: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{name} lacks the field {f.name!r}")
            continue
        raw = d[f.name]
        if parse and f.name in parse:
            kwargs[f.name] = parse[f.name](raw, f"{name} {f.name}")
        else:
            kwargs[f.name] = tuple(raw) if isinstance(raw, list) else raw
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # TypeError: a list where a number belongs, compared
        raise ValueError(f"{name}: {e}") from None


def load(parse: Callable[[], T], where: str, fix: str) -> T:
    """Run a reader of JSON that came from ``where`` (a file, a device; the reader names it in its own
    messages); a value outside its meaning (ValueError) becomes one InputError with the fix, a value of a
    wrong type deep inside one naming ``where``."""
    try:
        return parse()
    except InputError:
        raise
    except ValueError as e:
        raise InputError(str(e), fix) from None
    except schema.MALFORMED as e:
        raise InputError(f"{where} is malformed ({type(e).__name__}: {str(e)[:160]})", fix) from None


# ---- writing a result as JSON ------------------------------------------------------------------------


def to_json(x: object) -> Any:
    """A result (dataclasses, mappings, sequences of them) as plain JSON values; a non-finite float as
    null; a field marked OMIT_NONE is left out when None. A class may shape its own JSON with a
    ``to_dict()`` method (which may call ``fields_json``)."""
    to_dict = getattr(x, "to_dict", None)
    if to_dict is not None and dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_json(to_dict())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return fields_json(x)
    if isinstance(x, Mapping):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_json(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def fields_json(x: Any) -> JSONObject:
    """A dataclass's fields as JSON, in their order (see to_json)."""
    return {f.name: to_json(getattr(x, f.name)) for f in dataclasses.fields(x)
            if not (f.metadata.get("omit_none") and getattr(x, f.name) is None)}  # fmt: skip
