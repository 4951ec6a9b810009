"""`quarl-edge tune`: the fastest deployable variant of a policy that keeps its reward, chosen on the device.

``--out`` is checked before anything is written (tune/outdir.py) and held by one tune at a time. Stages,
cheapest first, each measurement cached in ``DIR/.cache/state.json`` by content (tune/cache.py) so an
interrupted tune resumes and a second tune with the same inputs is nearly free:

1. per-layer fallback (host, tune/layers.py): from every layer int8, the most sensitive layers go back
   to float, greedily, until the agreement proxy passes; when none does, every greedy step is judged
   by reward in stage 5;
2. the candidates bundle (tune/candidates.py): fp32, fp16, int8 x calibration method x {default split,
   the search's splits} x runtime options (ONNX U8S8 activations, the other weight granularity);
3. screen (host): each candidate's agreement with fp32 on the recorded states;
4. (tune/judge.py) latency on the device, one model at a time, at every thread count up to the device's cores;
5. closed loop on the device, fastest first: paired-seed reward against fp32; a close call is
   re-checked on fresh seeds; the first that passes the gate is the choice (fp32 passes by definition,
   so the choice is never slower than the fastest fp32 measured). Where the policy's environment cannot
   run here (Isaac Sim, a robot), the action error on the recorded observations (--calibration) is the
   verdict instead, within --max-action-error; no episode runs and no reward is estimated.

The shipped bundle is the measured files, copied (tune/ship.py). A time budget stops the search with the
best so far.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quarl_edge.bench.device import device_stub
from quarl_edge.bench.transport import transport_for
from quarl_edge.bundle import graph_cache
from quarl_edge.devices.check import check_device
from quarl_edge.devices.preflight import check_env
from quarl_edge.devices.profiles import load_profile
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace, save_trace
from quarl_edge.tune.cache import STATE_VERSION, State, device_sha256, digest, policy_sha256, tool_versions
from quarl_edge.tune.candidates import IMPORTED, IMPORTED_FORMATS, Candidate, grid
from quarl_edge.tune.config import KINDS, TuneConfig
from quarl_edge.tune.context import Search
from quarl_edge.tune.judge import by_action_error, closed_loop, latency
from quarl_edge.tune.layers import default_float_layers, layer_search
from quarl_edge.tune.outdir import check_out, locked
from quarl_edge.tune.records import CandidateRow, Inputs, LayerEvidence, TuneDevice, TuneSettings
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.ship import write_outputs

__all__ = ["STAGES", "TuneConfig", "device_formats", "run_tune"]

Log = Callable[[str], None]
Stage = Callable[[str], None]
STAGES = 7  # the stage() calls of run_tune, for a progress bar
TFLITE_RUNTIMES = ("ai_edge_litert", "tflite_runtime", "tensorflow")


def device_formats(facts: dict[str, Any], device: str) -> tuple[str, ...]:
    runtimes = facts.get("runtimes") or {}
    formats = tuple(f for f, mods in (("onnx", ("onnxruntime",)), ("tflite", TFLITE_RUNTIMES))
                    if any(runtimes.get(m) for m in mods))  # fmt: skip
    if formats and facts.get("c_compiler") and runtimes.get("numpy"):  # C candidates: a compiler there
        formats += ("c",)
    if not formats:
        raise InputError(f"device {device!r} has no runtime for any format (onnxruntime or LiteRT)",
                         f"install one there with `quarl-edge devices setup {device}`")  # fmt: skip
    return formats


def _imported_formats(formats: tuple[str, ...], device: str) -> tuple[str, ...]:
    kept = tuple(f for f in formats if f in IMPORTED_FORMATS)
    if not kept:
        raise InputError(f"device {device!r} has no onnxruntime, and an imported ONNX graph is exported to ONNX "
                         "only", f"install it there with `quarl-edge devices setup {device}`")  # fmt: skip
    return kept


def _host_can_export_tflite() -> bool:
    import importlib.util

    return importlib.util.find_spec("litert_torch") is not None


def _candidates(s: Search, formats: tuple[str, ...]) -> tuple[list[Candidate], list[LayerEvidence]]:
    """The grid plus each format's per-layer search; a search split equal to the default split is the
    default candidate already."""
    kinds = s.cfg.kinds or KINDS
    everything = grid(formats, s.policy.arch.model == "nature_cnn", s.policy.source_model is not None)
    cands = [everything[0]] + [c for c in everything[1:] if c.kind in kinds]  # the reference stays
    evidence: list[LayerEvidence] = []
    if s.policy.source_model is not None:  # its formats are IMPORTED_FORMATS already (run_tune)
        s.notes.append(IMPORTED)
        return cands, evidence
    default = default_float_layers(s.policy)
    for fmt in [f for f in formats if f != "c"] if "int8-layers" in kinds else ():
        found, ev = layer_search(s.policy, fmt, s.proxy(), s.probe, s.over_budget, s.log)
        evidence.append(ev)
        for c in found:
            if c.float_layers == default and "int8-default" in kinds:
                s.notes.append(
                    f"{fmt}: the search's split {list(default)} is the default split (judged as such)"
                )
            else:
                cands.append(c)
    return cands, evidence


def run_tune(cfg: TuneConfig, log: Log = lambda _m: None, stage: Stage = lambda _m: None) -> TuneResult:
    """The whole search; returns the result (tune.json's ``tune`` block; tune/ship.py writes the files).
    ``stage`` hears each stage's start (the CLI's progress bar)."""
    t0 = time.monotonic()
    check_out(cfg)  # before anything is written
    profile = load_profile(cfg.device, cfg.overrides)
    policy = load_policy(
        cfg.policy, cfg.env, cfg.algo, cfg.vecnormalize, io=cfg.io, calibration=cfg.calibration
    )
    offline = not_measured(policy)
    check_verdict(cfg, offline)  # before anything is written
    policy_sha = policy_sha256(cfg.policy, cfg.vecnormalize, policy, cfg.io)
    with locked(cfg.out) as work, graph_cache() as graphs:  # one fp32 graph export per net for the run
        stage("check the device")
        facts = check_device(profile).facts
        if profile.transport != "local" and offline is None:  # the closed loop runs there: its env packages
            check_env(policy.spec.env, facts, profile.name)
        formats = device_formats(facts, profile.name)
        if "tflite" in formats and not _host_can_export_tflite():
            formats = tuple(f for f in formats if f != "tflite")
        if policy.spec.state:  # the C export covers stateless MLPs (exporters/c_onnx.py), no recurrent cell
            formats = tuple(f for f in formats if f != "c")
        if policy.source_model is not None:  # an imported ONNX graph: candidates.IMPORTED says why
            formats = _imported_formats(formats, profile.name)
        cores = int(facts.get("cores") or 1)
        threads = list(range(1, min(cores, cfg.max_threads or cores) + 1))
        trace_path = _calibration(cfg, policy, policy_sha, work, log)
        inputs = Inputs(policy_sha, sha256_file(trace_path), device_sha256(profile, facts), tool_versions())
        labels = {"the policy": inputs.policy_sha256, "the calibration": inputs.calibration_sha256,
                  "the device": inputs.device_sha256, "the tool versions": digest(inputs.tools)}  # fmt: skip
        key = digest(labels, cfg.seed, cfg.episodes, cfg.confirm_episodes, cfg.latency_samples, cfg.min_agreement,
                     threads, formats, STATE_VERSION)  # fmt: skip
        state = State(work / "state.json", key, labels, log)
        if state.cached:
            log(
                f"resuming: {state.cached} measurements of an earlier run with the same inputs are checked for reuse"
            )
        s = Search(cfg, log, policy, trace_path, state, work, t0 + cfg.budget_min * 60, inputs,
                   reference=f"{formats[0]}-fp32", graphs=graphs)  # fmt: skip
        ref_bundle = s.export("reference", (), (s.reference,))
        s.ref_actions = PolicyRunner(ref_bundle, s.reference, threads=1).replay(s.load_trace()).actions
        stage("per-layer search (host)")
        cands, layer_evidence = _candidates(s, formats)
        stage("export the candidates")
        bundle = s.export("candidates", tuple(c.variant() for c in cands[1:]), (s.reference,))
        s.sha = {m.name: m.sha256 for m in load_manifest(bundle).models}
        rows = {c.name: CandidateRow(c, s.sha[c.name]) for c in cands}
        stage("agreement screen (host)")
        for name, row in rows.items():
            agree = 1.0 if name == s.reference else s.state.get("screen", name, row.sha256)
            if agree is None:
                agree = s.state.put("screen", name, row.sha256, s.agreement(bundle, name))
            rows[name] = CandidateRow(row.candidate, row.sha256, agree)
        log(f"{len(cands)} candidates screened on the host; latency on {profile.name} at {threads} thread(s)")
        transport = transport_for(profile)
        device = device_stub(profile)
        try:
            stage(f"latency on {profile.name}")
            latency(s, bundle, threads, rows, device, transport)
            if offline is None:
                stage(f"closed loop on {profile.name}")
                choice = closed_loop(s, bundle, rows, device, transport)
            else:
                stage(f"action error on {profile.name}")
                choice = by_action_error(s, bundle, rows, device, transport)
            result = TuneResult(
                policy.spec.name, policy.spec.env.id, str(trace_path), inputs,
                TuneDevice(profile.name, profile.transport, bool(profile.emulated), cores,
                           facts.get("cpu_model"), facts.get("machine")),
                s.reference, tuple(rows.values()), choice,
                TuneSettings(cfg.max_reward_drop_pct, cfg.min_agreement, cfg.max_p99_ms, cfg.episodes, cfg.seed,
                             cfg.confirm_episodes, cfg.budget_min, tuple(threads), s.proxy(), cfg.max_action_error),
                tuple(s.notes), round(time.monotonic() - t0, 1), state.reused, tuple(layer_evidence), str(bundle),
                reward_not_measured=offline,
            )  # fmt: skip
            log(
                f"chosen: {choice.name if choice else 'none'}; shipping the measured files and benching them against fp32"
            )
            stage("bench the choice, write the outputs")
            return write_outputs(result, cfg, device, transport)
        finally:
            transport.close()


def not_measured(policy: Policy) -> str | None:
    """Why no episode can run (the policy's environment cannot run here, e.g. Isaac Sim or a robot), as a
    bench report says it; None when the closed loop can run."""
    env = policy.spec.env
    return f"the policy's environment {env.id!r} cannot run here" if env.family == "external" else None


def check_verdict(cfg: TuneConfig, offline: str | None) -> None:
    """What judges the candidates, settled before any work: the closed loop's reward, or where there is no
    environment, the action error on the recorded observations, which needs its limit and those
    observations (one line each, exit 2)."""
    if offline is None:
        if cfg.max_action_error is not None:
            raise InputError("--max-action-error judges a policy whose environment cannot run here; this one's "
                             "runs here, so tune judges it by closed-loop reward",
                             "drop --max-action-error (gate the action error of tune.json with `quarl-edge gate "
                             "DIR/tune.json --max-action-error X`)")  # fmt: skip
        return
    if cfg.max_action_error is None:
        raise InputError(f"{offline}, so tune judges the candidates by their action error against fp32 on the "
                         "recorded observations, and no limit was given",
                         "pass --max-action-error X (max |Δa| in action units; for discrete actions the share "
                         "of differing actions), e.g. --max-action-error 0.05 (docs/tune.md)")  # fmt: skip
    if cfg.calibration is None:
        raise InputError(f"{offline}, so no rollouts can be recorded for calibration and the action error",
                         "pass the robot's recorded observations: --calibration OBS.npz (docs/policies.md)")  # fmt: skip


def _calibration(cfg: TuneConfig, policy: Policy, policy_sha: str, work: Path, log: Log) -> Path:
    """--calibration, else rollouts of this policy recorded once into the cache (named by the policy's
    content: another policy at the same path records its own)."""
    if cfg.calibration is not None:
        return cfg.calibration
    path = work / f"calibration-{policy_sha[:16]}.npz"
    if path.is_file():
        try:
            load_trace(path)
            return path
        except QuarlError as e:
            log(f"tune's recorded calibration {path.name} is damaged ({e.problem[:120]}): recording it again")
    for old in work.glob("calibration*.npz"):  # recorded for another policy (or by an older tune)
        if old != path and not old.is_symlink():
            old.unlink()
    from quarl_edge.record import RecordConfig, record

    log("no --calibration given: recording 10 episodes for calibration and the agreement screen")
    save_trace(record(policy, RecordConfig(episodes=10, epsilon=0.1, seed=0, max_samples=2000)), path)
    return path
