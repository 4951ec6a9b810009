"""One tune's working context, shared by its stages (tune/search.py runs them, tune/judge.py measures on
the device): the config, the loaded policy, the cache, the budget, the notes for the report, and the
bundles in the cache folder, keyed by content and checked before they are reused."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge import __version__
from quarl_edge.bundle import BundleRequest, GraphCache, Variant, export_bundle
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.manifest import Manifest, load_manifest
from quarl_edge.runtimes.signer import sign_bundle
from quarl_edge.runtimes.trace import Trace, load_observations
from quarl_edge.tune.cache import State, digest
from quarl_edge.tune.candidates import Candidate
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.layers import fan_out, model_agreement
from quarl_edge.tune.records import Drift, Inputs

Log = Callable[[str], None]


@dataclass
class Search:
    cfg: TuneConfig
    log: Log
    policy: Policy
    trace_path: Path
    state: State
    work: Path
    deadline: float
    inputs: Inputs
    reference: str = "onnx-fp32"
    ref_actions: Any = None
    notes: list[str] = field(default_factory=list)
    trace: Trace | None = None
    manifests: dict[Path, Manifest] = field(default_factory=dict)
    sha: dict[str, str] = field(default_factory=dict)
    """each candidate's model file sha256 in the candidates bundle: what its measurements are keyed by"""
    graphs: GraphCache | None = None
    """the fp32 graphs of ``policy`` exported so far in this run (bundle.graph_cache)"""

    def over_budget(self) -> bool:
        return time.monotonic() > self.deadline

    def load_trace(self) -> Trace:
        if self.trace is None:
            self.trace = load_observations(self.trace_path)  # a recorded trace, or a robot's observations
        return self.trace

    def agreement(self, bundle: Path, model: str) -> float:
        # each bundle's manifest (its hash check covers every model) is read once
        if bundle not in self.manifests:
            self.manifests[bundle] = load_manifest(bundle)
        return model_agreement(bundle, model, self.manifests[bundle], self.load_trace(), self.ref_actions)

    @property
    def reward_measured(self) -> bool:
        """False where the policy's environment cannot run here: the action error is the verdict."""
        return self.policy.spec.env.family != "external"

    def proxy(self) -> float:
        return self.cfg.proxy(self.policy.spec.action_space.is_discrete)

    def probe(self, cands: Sequence[Candidate]) -> dict[str, float]:
        """Agreement of each candidate exported alone (cached; the uncached fan out). The cache key holds
        the policy, calibration and tools; the name holds every export setting of the candidate."""
        got = {c.name: self.state.get("layers", c.name, c.name) for c in cands}
        todo = [c for c in cands if got[c.name] is None]
        if todo:
            run = fan_out(self.policy, self.trace_path, self.ref_actions, self.cfg.parallel, self.graphs)
            for c, value in zip(todo, run([c.variant() for c in todo]), strict=True):
                got[c.name] = self.state.put("layers", c.name, c.name, float(value))
        return {n: float(v) for n, v in got.items()}

    def _pair(self, name: str) -> str:
        return f"{self.sha[name]}+{self.sha[self.reference]}"

    def closed(self, name: str, stage: str = "closed") -> Drift | None:
        """The cached closed loop of ``name`` against the reference, for exactly these two model files."""
        value: Drift | None = self.state.get(stage, name, self._pair(name))
        return value

    def put_closed(self, stage: str, name: str, drift: Drift) -> Drift:
        return self.state.put(stage, name, self._pair(name), drift)

    def measured_error(self, name: str, threads: int) -> float | None:
        """The cached action error of ``name`` at ``threads`` against the reference, for these two files."""
        value: float | None = self.state.get("action_error", f"{name}@{threads}", self._pair(name))
        return value

    def put_error(self, name: str, threads: int, error: float) -> float:
        return float(self.state.put("action_error", f"{name}@{threads}", self._pair(name), float(error)))

    def export(self, name: str, variants: tuple[Variant, ...], targets: tuple[str, ...] = ()) -> Path:
        """A bundle of ``variants`` (and ``targets``) in the cache folder, named by its content: the policy,
        the calibration, the tools and every export setting. A cached one is reused only when it passes
        its own hash check and holds this policy, this calibration and these models; else it is exported
        again (one log line says why)."""
        key = digest(self.inputs.policy_sha256, self.inputs.calibration_sha256, self.inputs.tools, targets,
                     [(v.name, v.target, asdict(v.config)) for v in variants])  # fmt: skip
        out = self.work / f"{name}-{key[:16]}"
        if out.is_symlink() or out.exists():
            problem = self._unsound(out, [*targets, *(v.name for v in variants)])
            if problem is None:
                if self.cfg.sign_key is not None:  # cached by a tune without --sign, or with another key
                    sign_bundle(out, self.cfg.sign_key)
                return out
            self.log(f"tune's cached {name} bundle {out.name} {problem}: exporting it again")
            _remove(out)
        for old in self.work.iterdir():  # the same bundle for other inputs: stale
            if old != out and re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{16}}", old.name):
                _remove(old)
        export_bundle(self.policy, BundleRequest(out=out, targets=targets, variants=variants,
                                                 calibration=self.trace_path, sign_key=self.cfg.sign_key,
                                                 graphs=self.graphs))  # fmt: skip
        return out

    def _unsound(self, bundle: Path, names: list[str]) -> str | None:
        """Why a cached bundle may not be reused, or None."""
        if bundle.is_symlink() or not bundle.is_dir():
            return "is not a folder"
        try:
            m = load_manifest(bundle)  # every file's sha256 against the manifest
        except QuarlError as e:
            return f"fails its check ({e.problem[:160]})"
        calibration = (m.calibration or {}).get("sha256")
        if [x.name for x in m.models] != names:
            return "holds other models"
        if m.policy.to_dict() != self.policy.spec.to_dict() or calibration != self.load_trace().sha256:
            return "was made from another policy or calibration"
        if m.tool_version != __version__:
            return "was made by another quarl-edge"
        return None


def _remove(path: Path) -> None:
    """A folder of tune's cache (never followed when it is a link)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)
