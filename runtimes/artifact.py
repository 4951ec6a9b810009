"""Reading a JSON artifact we wrote (manifest, checkpoint, report, partial bench): one check of the
file, its size, its JSON, its format tag and schema version, each failure one domain error."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError, QuarlError
from .schema import JSONObject

MAX_JSON_BYTES = 64 * 2**20  # our largest (a report of many models) is a few MB


def read_artifact(
    path: Path,
    fmt: str,
    max_version: int,
    what: str,
    fix: str,
    error: type[QuarlError] = InputError,
    version_key: str = "schema_version",
) -> JSONObject:
    """``path`` parsed as a ``fmt`` artifact no newer than ``max_version``; ``what`` names it in errors
    ("report", "partial bench file", ...), ``fix`` says what to do; ``error`` is raised for a damaged file."""
    where = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise error(f"{what} {where!r} is {size} bytes, too large to be one", fix)
        data = path.read_bytes()
    except ValueError as e:  # a path the OS cannot take (a NUL byte)
        raise error(f"{what} {where!r} cannot be read ({str(e)[:160]})", fix) from None
    return parse_artifact(data, where, fmt, max_version, what, fix, error, version_key)


def parse_artifact(
    data: bytes,
    where: str,
    fmt: str,
    max_version: int,
    what: str,
    fix: str,
    error: type[QuarlError] = InputError,
    version_key: str = "schema_version",
) -> JSONObject:
    """``data`` (the bytes of the file ``where``) parsed as read_artifact does: for a caller that must
    check the very bytes it parses (a signed manifest, a file read without following links)."""
    if len(data) > MAX_JSON_BYTES:
        raise error(f"{what} {where!r} is {len(data)} bytes, too large to be one", fix)
    try:
        doc = json.loads(data)
    except ValueError as e:  # bad UTF-8, bad JSON, an integer of more digits than Python converts
        raise error(f"{what} {where!r} is not valid JSON ({str(e)[:160]})", fix) from None
    except RecursionError:
        raise error(f"{what} {where!r} is nested too deeply to be one", fix) from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise InputError(f"{where!r} is not a quarl-edge {what}", fix)
    version = doc.get(version_key, 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise error(f"{what} {where!r} has a {version_key} that is not an integer ({version!r})", fix)
    if version > max_version:
        raise InputError(
            f"{what} {where!r} is newer than this quarl-edge (schema {version})", "upgrade quarl-edge"
        )
    return doc
