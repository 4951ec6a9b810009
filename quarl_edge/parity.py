"""fp32 parity against the source: the exported fp32 models against the policy they came from (an
imported zip's own ``predict``, a checkpoint's torch module) on the bundle's trace, so that "the exported
fp32 model is the policy" is measured at export, not assumed by every later comparison (bench and tune
compare the quantized models against the exported fp32 one)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from quarl_edge.runtimes.envs import bounds
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.manifest import Manifest
from quarl_edge.runtimes.parity import ModelParity, SourceParity
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.spec import SpaceSpec
from quarl_edge.runtimes.trace import Trace

if TYPE_CHECKING:
    from quarl_edge.policy.net import Policy


def compare_actions(
    space: SpaceSpec, ref: np.ndarray, got: np.ndarray
) -> tuple[float, float | None, float | None]:
    """(agreement, max |Δa|, mean |Δa|) of two action arrays of one action space."""
    if space.is_integer:  # per component for MultiDiscrete / MultiBinary
        return float(np.mean(ref.reshape(len(ref), -1) == got.reshape(len(got), -1))), None, None
    a = ref.astype(np.float64).reshape(len(ref), -1)
    b = got.astype(np.float64).reshape(len(got), -1)
    low, high = bounds(space)
    rng = (high - low).reshape(-1)
    rng = np.where(np.isfinite(rng) & (rng > 0), rng, 1.0)
    diff = np.abs(a - b)
    return max(0.0, 1.0 - float(np.mean(diff / rng))), float(diff.max()), float(diff.mean())


def source_parity(policy: Policy, bundle: Path, manifest: Manifest, trace: Trace,
                  models: Iterable[str]) -> SourceParity:  # fmt: skip
    """Each of ``models`` (fp32, in ``bundle``) against ``policy.reference`` (else its torch module) on the
    trace's observations. A reference that cannot run here is reported, not raised: the export stands."""
    if policy.reference is not None:
        name = policy.reference_name
    elif policy.spec.source.startswith("onnx:"):  # an imported graph: the source itself, run by onnxruntime
        name = f"the source graph {policy.spec.source[5:]} (onnxruntime)"
    else:
        name = "the checkpoint's torch module"
    obs = trace.obs
    rows = (
        np.all(np.isfinite(obs.reshape(len(obs), -1)), axis=1)
        if obs.dtype.kind == "f"
        else np.ones(len(obs), bool)
    )
    obs = obs[rows]
    masks = trace.action_masks[rows] if trace.action_masks is not None and policy.arch.action_mask else None
    starts = trace.episode_starts()[rows]  # a recurrent policy: its state zeroed at each episode's start
    try:
        if policy.reference is not None:
            ref = np.asarray(policy.reference(obs, masks, starts))
        else:
            ref = np.asarray(policy.predict(obs, masks, starts))
    except QuarlError as e:
        return SourceParity(name, error=str(e))
    except Exception as e:  # the source library's own load or predict failing is a finding, not a crash
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return SourceParity(name, error=f"{type(e).__name__}: {first}")
    out = []
    space = policy.spec.action_space
    for model in models:
        rep = PolicyRunner(bundle, model, manifest=manifest).replay(trace)
        got = rep.actions[rows]
        agreement, max_diff, mean_diff = compare_actions(space, ref, got)
        out.append(ModelParity(model, int(len(obs)), agreement, max_diff, mean_diff))
    return SourceParity(name, tuple(out))
