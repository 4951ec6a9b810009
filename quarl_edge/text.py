"""Untrusted text (names, paths, error messages from files, arguments or devices) made safe to show.

A name read from a manifest or a message sent by a device is data: on a terminal it must not move the
cursor, clear the screen or start a new line, in rich it must not be markup, in JUnit it must be valid
XML, in a Markdown table it must stay inside its cell. ``clean`` is the one place that decides how a
control character is shown: as its visible escape (``\\x1b``, ``\\n``), so two names that differ only
by one stay distinguishable and the output holds no control character at all.
"""

from __future__ import annotations

import re

from rich.markup import escape as _rich_escape

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL, C1; lone surrogates (not encodable: printing or writing them raises); U+FFFE/U+FFFF (not
# XML); bidi overrides and isolates and the Unicode line/paragraph separators (they reorder or break
# a line on a terminal or a web page without being visible).
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)
_CONTROL_BUT_NEWLINE = re.compile(_CONTROL.pattern.replace("\x00-\x1f", "\x00-\x09\x0b-\x1f"))


def _visible(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def clean(text: object, *, newlines: bool = False) -> str:
    """``text`` with every control character replaced by its visible escape (``newlines=True``: a
    newline is kept, for text whose layout is lines)."""
    return (_CONTROL_BUT_NEWLINE if newlines else _CONTROL).sub(_visible, str(text))


def markup_safe(text: object) -> str:
    """``text`` cleaned and escaped, to put inside rich markup of our own ("[bold]{safe}[/]")."""
    return _rich_escape(clean(text))


def md_cell(text: object) -> str:
    """``text`` as one Markdown table cell (or inline text): one line, ``|`` escaped, no HTML."""
    t = clean(text).replace("\\", "\\\\").replace("|", "\\|")
    return t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
