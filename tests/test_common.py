"""The shared pieces below every stage (quarl_edge.common, runtimes.fsutil.finite_json): one Markdown table
writer that keeps every cell in its cell, and one finite-JSON rule for the host and the device."""

from __future__ import annotations

import json
import math

from quarl_edge.common.markdown import markdown_table
from quarl_edge.runtimes.fsutil import finite_json


def test_every_cell_of_a_markdown_table_stays_in_its_cell() -> None:
    hostile = "a|b\n| x | y |<script>&"
    lines = markdown_table(["model", "p|50"], [[hostile, 1.5], ["onnx-int8", None]])
    assert len(lines) == 4  # header, separator, two rows: the newline did not start a row
    assert lines[1] == "|---|---|"
    # splitting on the unescaped pipes gives back exactly two cells per line
    for line in (lines[0], lines[2], lines[3]):
        cells = [c for c in line.replace("\\|", "").split("|")][1:-1]
        assert len(cells) == 2, line
    assert "<script>" not in lines[2] and "&lt;script&gt;&amp;" in lines[2] and "\\n" in lines[2]
    assert lines[3] == "| onnx-int8 | None |"


def test_finite_json_writes_every_non_finite_number_as_null() -> None:
    data = {"a": math.nan, "b": [1.0, math.inf, (-math.inf, 2)], "c": {"d": 0.5, "e": "nan"}}
    out = finite_json(data)
    assert out == {"a": None, "b": [1.0, None, [None, 2]], "c": {"d": 0.5, "e": "nan"}}
    json.dumps(out, allow_nan=False)  # strict JSON
