"""The per-layer search's logic over a real policy's layers, with the probe (export + replay, covered by
tests/test_tune.py end to end) replaced by a sensitivity table, so every branch is checked in
milliseconds: all-int8 passes the proxy; the most sensitive layers go back to float until it passes;
no split passes and every greedy step goes to the closed loop; the budget stops the greedy steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from quarl_edge.policy.load import load_policy
from quarl_edge.tune.candidates import KINDS, Candidate, grid
from quarl_edge.tune.layers import default_float_layers, layer_search


@pytest.fixture(scope="module")
def policy(pendulum_policy: Path):  # type: ignore[no-untyped-def]
    return load_policy(pendulum_policy)


def table_probe(values: dict[tuple[str, ...], float], calls: list[str]):  # type: ignore[no-untyped-def]
    """agreement by the set of layers kept in float (any order), like a real probe would return"""

    def probe(cands: Sequence[Candidate]) -> dict[str, float]:
        calls.extend(c.name for c in cands)
        return {c.name: values[tuple(sorted(c.float_layers or ()))] for c in cands}

    return probe


def layers_of(policy) -> list[str]:  # type: ignore[no-untyped-def]
    from quarl_edge.exporters.base import compute_layers

    return compute_layers(policy)


def test_all_int8_passing_the_proxy_is_the_only_candidate(policy) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    found, ev = layer_search(
        policy, "onnx", 0.9, table_probe({(): 0.95}, calls), lambda: False, lambda _m: None
    )
    assert [c.float_layers for c in found] == [()] and calls == ["onnx-int8-minmax-float-none"]
    assert ev.result == "every layer int8 passes the proxy"


def test_the_most_sensitive_layers_go_back_to_float_until_the_proxy_passes(policy) -> None:  # type: ignore[no-untyped-def]
    a, b, c = layers_of(policy)
    rest = {a: (b, c), b: (a, c), c: (a, b)}
    # alone-int8 agreement: c is the most sensitive, then a; with c in float 0.93, with c and a 0.99
    values = {(): 0.5, tuple(sorted(rest[a])): 0.9, tuple(sorted(rest[b])): 0.99, tuple(sorted(rest[c])): 0.6,
              (c,): 0.93, tuple(sorted((a, c))): 0.99}  # fmt: skip
    calls: list[str] = []
    found, ev = layer_search(
        policy, "tflite", 0.98, table_probe(values, calls), lambda: False, lambda _m: None
    )
    assert len(found) == 1 and set(found[0].float_layers or ()) == {a, c}
    assert found[0].float_layers == tuple(x for x in (a, b, c) if x in (a, c))  # graph order: one name
    assert [k for k, _ in ev.alone] == [c, a, b] and f"{c} (alone 0.600)" in found[0].origin
    assert [list(fl) for fl, _ in ev.steps] == [[c], [c, a]]


def test_no_split_passing_sends_every_greedy_step_to_the_closed_loop(policy) -> None:  # type: ignore[no-untyped-def]
    a, b, c = layers_of(policy)
    values = {(): 0.4, tuple(sorted((b, c))): 0.5, tuple(sorted((a, c))): 0.45, tuple(sorted((a, b))): 0.42,
              (c,): 0.5, tuple(sorted((b, c))): 0.6}  # fmt: skip
    found, ev = layer_search(policy, "onnx", 0.95, table_probe(values, []), lambda: False, lambda _m: None)
    # all-int8, then c (most sensitive), then c and b; never all-float (that is fp32)
    assert [set(x.float_layers or ()) for x in found] == [set(), {c}, {b, c}]
    assert all("judged by reward" in x.origin for x in found) and "no split passes" in ev.result


def test_the_budget_stops_the_greedy_steps(policy) -> None:  # type: ignore[no-untyped-def]
    a, b, c = layers_of(policy)
    values = {(): 0.4, tuple(sorted((b, c))): 0.5, tuple(sorted((a, c))): 0.45, tuple(sorted((a, b))): 0.42}
    found, ev = layer_search(policy, "onnx", 0.95, table_probe(values, []), lambda: True, lambda _m: None)
    assert [x.float_layers for x in found] == [()] and "budget" in ev.result


def test_the_grid_and_kinds(policy) -> None:  # type: ignore[no-untyped-def]
    cands = grid(("onnx", "tflite"), cnn=False)
    names = [c.name for c in cands]
    assert names[0] == "onnx-fp32" and len(names) == len(set(names))
    assert {"onnx-int8-minmax-u8s8", "onnx-int8-minmax-per-channel", "tflite-int8-minmax-per-tensor"} <= set(
        names
    )
    assert {c.kind for c in cands} == set(KINDS) - {"int8-layers"}
    for c in cands:  # the report's row rebuilds the same candidate (tune.json -> the chosen bundle)
        assert Candidate.from_dict(c.to_dict()) == c
    assert "onnx-int8-minmax-per-tensor" in [c.name for c in grid(("onnx",), cnn=True)]
    assert default_float_layers(policy) == (layers_of(policy)[0], layers_of(policy)[-1])
