"""tune's per-layer fallback: from every compute layer int8, rank the layers by sensitivity (the action
agreement on the recorded states when that layer alone is int8, as OpenVINO's accuracy-aware method ranks
them, judged by the policy's own actions) and put the most sensitive back in float, greedily, until the
cheap proxy passes. When no split reaches the proxy (a DQN's near-tie Q-values make exact-match agreement
a poor guide: LunarLander DQN's int8 models agree on 37-66% of states and keep their reward), every greedy
step goes to the closed loop, which judges them by reward, fastest first.

The probes (one export + one replay each) are independent, so with ``--workers N`` the sensitivity probes
run side by side (local processes or Ray tasks, ``--address`` for a cluster: quarl_edge/parallel.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from quarl_edge.bench.run import action_agreement
from quarl_edge.bundle import BundleRequest, GraphCache, Variant, export_bundle
from quarl_edge.exporters.base import compute_layers, quantized_layers
from quarl_edge.parallel import Workers, pool
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.manifest import Manifest, load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import Trace, load_observations
from quarl_edge.tune.candidates import Candidate
from quarl_edge.tune.records import LayerEvidence

Probe = Callable[[Sequence[Candidate]], dict[str, float]]
"""agreement with fp32 for each candidate, by name (cached measurements are not redone)"""


def agreement(manifest: Manifest, ref: np.ndarray, actions: np.ndarray) -> float:
    a = action_agreement(manifest, ref.tolist(), actions.tolist())
    return a.value if a else 0.0


def model_agreement(bundle: Path, model: str, manifest: Manifest, trace: Trace, ref: np.ndarray) -> float:
    actions = PolicyRunner(bundle, model, threads=1, manifest=manifest).replay(trace).actions
    return agreement(manifest, ref, actions)


def probe_task(
    policy: Policy, variant: Variant, trace_bytes: bytes, ref: np.ndarray, graphs: GraphCache | None = None
) -> float:
    """One probe, self-contained so it runs as a Ray task anywhere: export the variant alone, replay the
    recorded states, agreement with fp32's actions. ``graphs``: in this process, the run's fp32 graphs."""
    with tempfile.TemporaryDirectory(prefix="quarl-tune-probe-") as tmp:
        trace_path = Path(tmp) / "trace.npz"
        trace_path.write_bytes(trace_bytes)
        out = Path(tmp) / "bundle"
        req = BundleRequest(out=out, targets=(), variants=(variant,), calibration=trace_path, graphs=graphs)
        export_bundle(policy, req)
        return model_agreement(out, variant.name, load_manifest(out), load_observations(trace_path), ref)


def fan_out(
    policy: Policy, trace_path: Path, ref: np.ndarray, workers: Workers, graphs: GraphCache | None = None
) -> Callable[[list[Variant]], list[float]]:
    """Run probes side by side as ``workers`` says (one at a time in this process by default, where they
    share ``graphs``; the workers export their own)."""
    trace_bytes = trace_path.read_bytes()

    def run(variants: list[Variant]) -> list[float]:
        if len(variants) < 2 or workers.backend == "in-process":
            return [probe_task(policy, v, trace_bytes, ref, graphs) for v in variants]
        with pool(workers) as p:
            return [float(x) for x in p.map(_probe, [(v,) for v in variants], (policy, trace_bytes, ref))]

    return run


def _probe(policy: Policy, trace_bytes: bytes, ref: np.ndarray, variant: Variant) -> float:
    """:func:`probe_task` with what every probe shares first (sent once to Ray)."""
    return probe_task(policy, variant, trace_bytes, ref)


def default_float_layers(policy: Policy) -> tuple[str, ...]:
    return tuple(quantized_layers(policy, True)[1])


def layer_search(policy: Policy, fmt: str, proxy: float, probe: Probe, over_budget: Callable[[], bool],
                 log: Callable[[str], None]) -> tuple[list[Candidate], LayerEvidence]:  # fmt: skip
    """The per-layer search's candidates for one format, and its evidence (for the report)."""
    layers = compute_layers(policy)
    alone: dict[str, float] = {}
    steps: list[tuple[tuple[str, ...], float]] = []

    def evidence(result: str) -> LayerEvidence:
        return LayerEvidence(fmt, proxy, all_int8, tuple(alone.items()), tuple(steps[1:]), result)

    def split(float_layers: tuple[str, ...], origin: str = "") -> Candidate:
        # graph order, so one split has one name (and matches the default split when it is that)
        in_order = tuple(x for x in layers if x in float_layers)
        return Candidate(fmt, "int8", float_layers=in_order, origin=origin)

    every = split(())
    all_int8 = probe([every])[every.name]
    log(f"{fmt} int8, every layer: agreement {all_int8:.3f} (proxy {proxy:g})")
    if all_int8 >= proxy:
        return [split((), f"every layer int8: agreement {all_int8:.3f} >= {proxy:g}")], evidence(
            "every layer int8 passes the proxy"
        )
    only = {lay: split(tuple(x for x in layers if x != lay)) for lay in layers}
    measured = probe(list(only.values()))
    ranked = sorted(layers, key=lambda lay: measured[only[lay].name])
    alone.update((lay, measured[only[lay].name]) for lay in ranked)
    log("layer sensitivity (agreement with only that layer int8): "
        + ", ".join(f"{lay} {alone[lay]:.3f}" for lay in ranked))  # fmt: skip
    steps.append(((), all_int8))
    kept: list[str] = []
    result = "no split passes the proxy: every greedy step is judged by reward"
    for lay in ranked[:-1]:  # all-float is the fp32 model
        if over_budget():
            result = "the time budget ran out during the greedy steps"
            break
        kept.append(lay)
        c = split(tuple(kept))
        value = probe([c])[c.name]
        steps.append((tuple(kept), value))
        if value >= proxy:
            why = (f"all-int8 agreement {all_int8:.3f} < {proxy:g}; most sensitive "
                   + ", ".join(f"{k} (alone {alone[k]:.3f})" for k in kept) + f" kept in float: {value:.3f}")  # fmt: skip
            log(f"{fmt} int8 with {', '.join(kept)} in float: agreement {value:.3f}")
            return [split(tuple(kept), why)], evidence(f"{', '.join(kept)} in float pass the proxy")
    log(
        f"{fmt} int8: no split reaches the proxy {proxy:g}; the closed loop judges the {len(steps)} greedy steps"
    )
    out = []
    for fl, value in steps:
        kept_txt = ", ".join(f"{k} (alone {alone[k]:.3f})" for k in fl) or "no layer"
        out.append(split(fl, f"greedy step {len(fl)}: {kept_txt} in float, agreement {value:.3f} < proxy "
                             f"{proxy:g}; judged by reward"))  # fmt: skip
    return out, evidence(result)
