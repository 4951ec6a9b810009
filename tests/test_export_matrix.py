"""Export, then run: every registered exporter target on every runtime adapter that runs its format.

The shipped CartPole PPO policy is exported with one target plus the onnx-fp32 reference, loaded
through the device runner and judged on behaviour: actions on the bundle's recorded trace agree with
the reference's, outputs fit the action space, and a closed-loop episode finishes. CartPole PPO scores
500 on every seed, so reward would not tell a broken model from a good one; agreement does (a model
with perturbed int8 weights, below, fails it).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import EXPORTERS
from quarl_edge.exporters.targets import load_builtin
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.runtimes import adapters
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import MissingDependencyError
from quarl_edge.runtimes.manifest import MANIFEST_NAME, load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace

REFERENCE = "onnx-fp32"
MIN_AGREEMENT = 0.95
"""share of the trace's states on which a model picks the reference's action (measured here: fp32 and
fp16 1.000, int8 0.992 on ONNX Runtime and LiteRT, int4 0.962)"""

load_builtin()
adapters._load_builtin_adapters()  # the registry's own loader (open_model calls it on first use)


def _format(target: str) -> str:
    # the bundle writer names files the same way (quarl_edge/bundle.py); the test checks the manifest agrees
    return target.rsplit("-", 1)[0]


MATRIX = [
    pytest.param(target, fmt, id=f"{target}:{fmt}")
    for target in EXPORTERS
    for fmt in [a for a in adapters.ADAPTERS if a == _format(target)] or [None]
]


Export = Callable[[str], Path]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path) -> Export:
    """``exported(target)``: the bundle of ``target`` + the reference, exported once per module."""
    policy = load_checkpoint(cartpole_policy)
    root = tmp_path_factory.mktemp("matrix")
    bundles: dict[str, Path | str] = {}

    def get(target: str) -> Path:
        if target not in bundles:
            targets = tuple(dict.fromkeys((REFERENCE, target)))
            try:
                out = root / target
                export_bundle(policy, BundleRequest(out=out, targets=targets, calibration=cartpole_calib))
                bundles[target] = out
            except MissingDependencyError as e:  # an optional extra that is not installed here
                bundles[target] = f"{target}: {e}"
        got = bundles[target]
        if isinstance(got, str):
            pytest.skip(got)
        return got

    return get


def open_runner(bundle: Path, model: str) -> PolicyRunner:
    try:
        return PolicyRunner(bundle, model, threads=1)
    except MissingDependencyError as e:  # the adapter's runtime package is not installed here
        pytest.skip(f"{model}: {e}")


def agreement(bundle: Path, model: str) -> float:
    """Share of the bundle's trace states where ``model`` and the reference choose the same action."""
    manifest = load_manifest(bundle)
    assert manifest.trace, "the bundle has no trace"
    trace = load_trace(bundle / manifest.trace["file"])
    ref = open_runner(bundle, REFERENCE).replay(trace)
    got = open_runner(bundle, model).replay(trace)
    valid = ref.valid & got.valid
    assert valid.sum() >= 100, f"only {valid.sum()} finite trace states"
    return float(np.mean(ref.actions[valid] == got.actions[valid]))


def assert_agrees(value: float, model: str) -> None:
    assert value >= MIN_AGREEMENT, (
        f"{model} agrees with {REFERENCE} on {value:.3f} of the trace's states (needs >= {MIN_AGREEMENT})"
    )


@pytest.mark.parametrize(("target", "fmt"), MATRIX)
def test_export_then_run(target: str, fmt: str | None, exported: Export) -> None:
    assert fmt is not None, f"no runtime adapter runs {target} (adapters: {', '.join(adapters.ADAPTERS)})"
    bundle = exported(target)
    manifest = load_manifest(bundle)
    assert manifest.model(target).format == fmt
    runner = open_runner(bundle, target)
    assert runner.session.format == fmt  # the runner opened it with this format's adapter

    assert_agrees(agreement(bundle, target), target)

    space = manifest.policy.action_space
    assert manifest.trace is not None
    obs = load_trace(bundle / manifest.trace["file"]).obs[:8]
    out = np.asarray(runner.act_batch(obs))
    assert out.shape == (len(obs), *space.shape), out.shape
    # e.g. LiteRT's argmax gives int32 where the space says int64: fine, the runner's act() casts it
    assert out.dtype.kind == np.dtype(space.dtype).kind, (out.dtype, space.dtype)
    assert np.can_cast(out.dtype, np.dtype(space.dtype), "safe"), (out.dtype, space.dtype)
    env = make_env(manifest.policy.env)
    try:
        assert env.action_space.contains(runner.act(obs[0])), runner.act(obs[0])
    finally:
        env.close()

    (episode,) = runner.episodes([0])
    assert episode.error is None, episode.error
    assert episode.length > 0 and episode.nonfinite_obs == 0


def test_reference_matches_the_torch_policy(exported: Export, cartpole_policy: Path) -> None:
    """The matrix judges every model against onnx-fp32: it must act as the policy itself does."""
    bundle = exported(REFERENCE)
    manifest = load_manifest(bundle)
    assert manifest.trace is not None
    trace = load_trace(bundle / manifest.trace["file"])
    ref = open_runner(bundle, REFERENCE).replay(trace).actions
    value = float(np.mean(ref == load_checkpoint(cartpole_policy).predict(trace.obs)))
    assert value >= 0.99, f"{REFERENCE} agrees with the torch policy on {value:.3f} of the trace's states"


def test_every_adapter_runs_some_target() -> None:
    """An adapter no exporter feeds would never be exercised by the matrix."""
    formats = {_format(t) for t in EXPORTERS}
    assert set(adapters.ADAPTERS) <= formats, (
        f"adapters without an exporter: {set(adapters.ADAPTERS) - formats}"
    )


def test_the_agreement_check_catches_broken_int8_weights(exported: Export, tmp_path: Path) -> None:
    """onnx-int8 with its int8 weight tensor negated (manifest re-hashed, so it loads): must fail."""
    import onnx
    from onnx import numpy_helper

    bundle = Path(shutil.copytree(exported("onnx-int8"), tmp_path / "broken"))
    path = bundle / "policy.int8.onnx"
    model = onnx.load(str(path))
    (weights,) = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8 and i.dims]
    flipped = -numpy_helper.to_array(weights).astype(np.int16)
    weights.CopyFrom(numpy_helper.from_array(np.clip(flipped, -128, 127).astype(np.int8), weights.name))
    onnx.save(model, str(path))
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    for m in manifest["models"]:
        if m["file"] == path.name:
            m["sha256"], m["size_bytes"] = hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))

    value = agreement(bundle, "onnx-int8")  # loads: the manifest matches the altered file
    with pytest.raises(AssertionError, match="agrees with onnx-fp32 on"):
        assert_agrees(value, "onnx-int8")
