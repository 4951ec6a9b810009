"""Export, then run: every registered exporter target on every runtime adapter that runs its format, and
what each format's files really contain, parametrized over the formats (ONNX, TFLite).

The shipped CartPole PPO is exported once with every target and judged on behaviour: actions on the
bundle's recorded trace agree with the onnx-fp32 reference's, outputs fit the action space, a closed-loop
episode finishes. CartPole PPO scores 500 on every seed, so reward would not tell a broken model from a
good one; agreement does (a model with perturbed int8 weights, below, fails it). Then, per format, read with
the format's own tools (tests/export_files.py): fp32 matches torch, int8 really is int8 (an ONNX QDQ graph
with int8 weights; a TFLite interpreter's int8 tensors) and is recorded so in the manifest, fp16 has fp16
weights and float32 I/O, every calibration method yields a working model, the trained zoo Pong DQN
(Nature-CNN, actions that vary frame to frame) keeps its actions at int8 in a third of the size; int8
keeps the fp32 return over 20 paired seeds in one bench of ONNX and TFLite models; and the bad inputs (an
op LiteRT cannot convert, the extra not installed, a corrupt or foreign .tflite) end in one line and exit
code 2. Run with `pytest -s` to see the figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from conftest import FAST_BENCH, assert_absent, assert_discriminating, assert_no_report, assert_one_error
from export_files import (
    check_manifest_records,
    inspect_int8,
    onnx_io_types,
    onnx_weight_types,
    tflite_io_dtypes,
    tflite_layers,
    tflite_tensor_dtypes,
)
from onnx import TensorProto, numpy_helper
from test_runtimes_no_torch import SITECUSTOMIZE
from torch import nn

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import EXPORTERS, ExportConfig, ExportContext
from quarl_edge.exporters.targets import load_builtin, resolve_targets
from quarl_edge.policy.net import Policy, build_policy, load_checkpoint
from quarl_edge.runtimes import adapters
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import InputError, MissingDependencyError
from quarl_edge.runtimes.litert import LiteRTSession
from quarl_edge.runtimes.manifest import MANIFEST_NAME, ModelEntry, load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import Trace, load_trace, save_trace

# onnxconverter-common warns about tiny weights rounded to fp16's smallest values: expected for fp16
pytestmark = pytest.mark.filterwarnings("ignore:the float32 number .* will be truncated:UserWarning")

REFERENCE = "onnx-fp32"
MIN_AGREEMENT = 0.95
"""share of the trace's states on which a model picks the reference's action (measured here: fp32 and
fp16 1.000, int8 0.992 on ONNX Runtime and LiteRT, int4 0.962)"""
FORMATS = ("onnx", "tflite")
TFLITE = ("tflite-fp32", "tflite-fp16", "tflite-int8")
PARITY_ATOL = 1e-4
PONG_SAMPLES = 1000  # the zoo Pong DQN's recorded frames (the trace); int8 calibrates on 400 of them
PONG_CALIBRATION = 400
INT8_AGREEMENT = 0.85  # trained Pong DQN, int8 vs fp32 on recorded frames (measured: see the print)
EPISODES = 20
MAX_DROP_PCT = 2.0

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


def _installed(target: str) -> str | None:
    """None when the target's extra is installed here, else why not."""
    try:
        resolve_targets([target])
    except MissingDependencyError as e:
        return f"{target}: {e}"
    return None


# ---- the bundles: each policy exported once, every format side by side ---------------------------------


@dataclass
class Exported:
    bundle: Path
    policy: Policy
    trace: Trace

    def entry(self, name: str) -> ModelEntry:
        return load_manifest(self.bundle).model(name)

    def file(self, name: str) -> Path:
        return self.bundle / self.entry(name).file

    def replay(self, model: str) -> np.ndarray:
        rep = PolicyRunner(self.bundle, model).replay(self.trace)
        assert rep.valid.all()
        return rep.actions


def _export(policy: Policy, out: Path, targets: tuple[str, ...], calib: Path, **cfg: Any) -> Exported:
    targets = tuple(t for t in targets if _installed(t) is None)  # a missing extra skips its tests only
    export_bundle(
        policy, BundleRequest(out=out, targets=targets, calibration=calib, config=ExportConfig(**cfg))
    )
    return Exported(out, policy, load_trace(out / "trace.npz"))


@pytest.fixture(scope="module")
def cartpole(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Exported:
    """Every registered target of the shipped CartPole PPO in one bundle; TFLite first, so that tflite-fp32
    is the bench's reference (the matrix names its reference, onnx-fp32)."""
    order = sorted(EXPORTERS, key=lambda t: _format(t) != "tflite")
    out = tmp_path_factory.mktemp("cartpole") / "bundle"
    return _export(load_checkpoint(cartpole_policy), out, tuple(order), cartpole_calib)


@pytest.fixture(scope="module")
def pendulum(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Exported:
    """The shipped Pendulum SAC (continuous actions, returns that vary by seed); TFLite first."""
    out = tmp_path_factory.mktemp("pendulum") / "bundle"
    targets = (*TFLITE, "onnx-fp32", "onnx-fp16")
    return _export(load_checkpoint(pendulum_policy), out, targets, pendulum_calib)


@pytest.fixture(scope="module")
def pong(tmp_path_factory: pytest.TempPathFactory, zoo_pong: tuple[Path, Path]) -> Exported:
    """The trained zoo Pong DQN (Nature-CNN, 2.25M steps), fp32 + fp16 + int8 in both formats; its 1,000
    recorded frames are the trace, int8 calibrates on 400 of them. A trained policy, whose actions vary
    from frame to frame: agreement with fp32 means something."""
    policy_dir, frames = zoo_pong
    policy = load_checkpoint(policy_dir)
    trace = load_trace(frames)
    assert trace.obs.shape == (PONG_SAMPLES, 4, 84, 84) and trace.obs.dtype == np.uint8
    assert_discriminating(policy.predict(trace.obs), 6)
    out = tmp_path_factory.mktemp("pong")
    calib = save_trace(trace, out / "pong.npz")
    targets = ("tflite-fp32", "tflite-int8", "onnx-fp32", "onnx-fp16", "onnx-int8")
    return _export(policy, out / "bundle", targets, calib, max_calibration_samples=PONG_CALIBRATION)


def _need(ex: Exported, *models: str) -> None:
    names = {m.name for m in load_manifest(ex.bundle).models}
    for m in models:
        if m not in names:
            pytest.skip(_installed(m) or f"{m} not exported")


# ---- every target on every adapter -------------------------------------------------------------------


def open_runner(bundle: Path, model: str) -> PolicyRunner:
    try:
        return PolicyRunner(bundle, model, threads=1)
    except MissingDependencyError as e:  # the adapter's runtime package is not installed here
        pytest.skip(f"{model}: {e}")


def agreement(bundle: Path, model: str) -> float:
    """Share of the bundle's trace states where ``model`` and the reference choose the same action."""
    manifest = load_manifest(bundle)
    assert manifest.trace, "the bundle has no trace"
    trace = load_trace(bundle / manifest.trace.file)
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
def test_export_then_run(target: str, fmt: str | None, cartpole: Exported) -> None:
    assert fmt is not None, f"no runtime adapter runs {target} (adapters: {', '.join(adapters.ADAPTERS)})"
    _need(cartpole, REFERENCE, target)
    bundle = cartpole.bundle
    manifest = load_manifest(bundle)
    assert manifest.model(target).format == fmt
    runner = open_runner(bundle, target)
    assert runner.session.format == fmt  # the runner opened it with this format's adapter

    assert_agrees(agreement(bundle, target), target)

    space = manifest.policy.action_space
    assert manifest.trace is not None
    obs = load_trace(bundle / manifest.trace.file).obs[:8]
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


def test_reference_matches_the_torch_policy(cartpole: Exported) -> None:
    """The matrix judges every model against onnx-fp32: it must act as the policy itself does."""
    ref = open_runner(cartpole.bundle, REFERENCE).replay(cartpole.trace).actions
    value = float(np.mean(ref == cartpole.policy.predict(cartpole.trace.obs)))
    assert value >= 0.99, f"{REFERENCE} agrees with the torch policy on {value:.3f} of the trace's states"


def test_every_adapter_runs_some_target() -> None:
    """An adapter no exporter feeds would never be exercised by the matrix."""
    formats = {_format(t) for t in EXPORTERS}
    assert set(adapters.ADAPTERS) <= formats, (
        f"adapters without an exporter: {set(adapters.ADAPTERS) - formats}"
    )


def test_the_agreement_check_catches_broken_int8_weights(cartpole: Exported, tmp_path: Path) -> None:
    """onnx-int8 with its int8 weight tensor negated (manifest re-hashed, so it loads): must fail."""
    bundle = Path(shutil.copytree(cartpole.bundle, tmp_path / "broken"))
    path = bundle / "policy.int8.onnx"
    model = onnx.load(str(path))
    (weights,) = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8 and i.dims]
    flipped = -numpy_helper.to_array(weights).astype(np.int16)
    weights.CopyFrom(numpy_helper.from_array(np.clip(flipped, -128, 127).astype(np.int8), weights.name))
    onnx.save(model, str(path))
    _rehash(bundle, path.name)

    value = agreement(bundle, "onnx-int8")  # loads: the manifest matches the altered file
    with pytest.raises(AssertionError, match="agrees with onnx-fp32 on"):
        assert_agrees(value, "onnx-int8")


# ---- fp32: the same actions as torch -----------------------------------------------------------------


def with_head(policy: Policy, head: str) -> Policy:
    """The same weights with another action head (``identity``: logits out, for numeric parity)."""
    arch = replace(policy.arch, head=head)
    return build_policy(replace(policy.spec, graph_steps=arch.graph_steps()), arch, policy.net.state_dict())


def export_one(target: str, policy: Policy, out: Path, calib: np.ndarray | None = None, **cfg: Any) -> Path:
    """One exporter, called as export_bundle calls it, without the bundle around it."""
    ctx = ExportContext(policy=policy, calibration=calib, config=ExportConfig(**cfg), workdir=out.parent)
    return EXPORTERS[target](ctx, out).file


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("which", ["cartpole", "pendulum"])
def test_fp32_actions_match_torch(fmt: str, which: str, request: pytest.FixtureRequest) -> None:
    ex: Exported = request.getfixturevalue(which)
    _need(ex, f"{fmt}-fp32")
    got, want = ex.replay(f"{fmt}-fp32"), ex.policy.predict(ex.trace.obs)
    assert len(got) == 1000
    if which == "cartpole":
        np.testing.assert_array_equal(got, want)
    else:
        assert got.dtype == np.float32 and got.shape == want.shape == (1000, 1)
        print(
            f"\nPendulum SAC fp32 {fmt} vs torch, 1000 obs: max |action diff| {np.abs(got - want).max():.2e}"
        )
        np.testing.assert_allclose(got, want, rtol=0, atol=PARITY_ATOL)


def test_fp32_tflite_cartpole_logits_match_torch(cartpole: Exported, tmp_path: Path) -> None:
    obs = cartpole.trace.obs
    logits = with_head(cartpole.policy, "identity")
    session = LiteRTSession(export_one("tflite-fp32", logits, tmp_path / "logits.tflite"))
    got, want = session.run(obs), logits.predict(obs)
    err = float(np.abs(got - want).max())
    print(f"\nCartPole PPO fp32 TFLite vs torch, 1000 obs: max |logit diff| {err:.2e}")
    np.testing.assert_allclose(got, want, rtol=0, atol=PARITY_ATOL)


@pytest.mark.slow
def test_fp32_tflite_pong_cnn_logits_and_actions_match_torch(pong: Exported, tmp_path: Path) -> None:
    obs = pong.trace.obs
    assert obs.shape == (PONG_SAMPLES, 4, 84, 84) and obs.dtype == np.uint8
    assert tflite_io_dtypes(pong.file("tflite-fp32"))[0] == "uint8"  # raw frames in, the /255 is in the graph
    np.testing.assert_array_equal(pong.replay("tflite-fp32"), pong.policy.predict(obs))
    np.testing.assert_array_equal(pong.replay("tflite-fp32"), pong.replay("onnx-fp32"))
    logits = with_head(pong.policy, "identity")
    session = LiteRTSession(export_one("tflite-fp32", logits, tmp_path / "logits.tflite"))
    got = session.run(obs)
    want = logits.predict(obs)
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    print(f"\nPong Nature-CNN fp32 TFLite vs torch, 1000 frames: max |logit diff| {err:.2e} of {scale:.2e}")
    np.testing.assert_allclose(got, want, rtol=0, atol=PARITY_ATOL)
    assert err <= 1e-4 * scale  # logits of this size: relative agreement too


# ---- int8 is int8 --------------------------------------------------------------------------------------


def _mlp_int8_is_int8(fmt: str, ex: Exported) -> None:
    """The default MLP int8 model: first and output layers in float (exporters/onnx.py _float_io_nodes),
    the rest integer, float I/O; the manifest records it as it is."""
    name = f"{fmt}-int8"
    entry = ex.entry(name)
    assert entry.precision == "int8"
    q = entry.quantization
    assert q["calibration_method"] == "minmax"
    if fmt == "onnx":
        assert q["per_channel"] is False  # default for MLPs
        g = inspect_int8(ex.file(name))
        assert len(g.int8_layers) + len(g.float_layers) == len(ex.policy.arch.hidden) + 1
        assert g.int8_layers, "no layer of the int8 model is int8"
        check_manifest_records(ex.bundle, entry, g)
        return
    layers = tflite_layers(ex.file(name))
    assert len(layers) == len(ex.policy.arch.hidden) + 1
    assert [lay.weights for lay in layers] == ["float32"] + ["int8"] * (len(layers) - 2) + ["float32"]
    assert all(lay.input == lay.output == "int8" for lay in layers[1:-1])
    assert tflite_io_dtypes(ex.file(name))[0] == "float32"
    assert q["float_nodes"] == q["float_layers"] == ["mlp.0", "out"]
    assert q["int8_weight_tensors"] == len(layers) - 2
    assert q["input"]["dtype"] == "float32" and "quantization" not in q["input"]
    assert q["calibration_samples"] == 2000


@pytest.mark.parametrize(
    ("fmt", "which"), [("onnx", "cartpole"), ("tflite", "cartpole"), ("tflite", "pendulum")]
)
def test_mlp_int8_has_int8_layers_and_float_io(fmt: str, which: str, request: pytest.FixtureRequest) -> None:
    ex: Exported = request.getfixturevalue(which)
    _need(ex, f"{fmt}-int8")
    _mlp_int8_is_int8(fmt, ex)


@pytest.fixture(scope="module")
def full_int8(tmp_path_factory: pytest.TempPathFactory, cartpole: Exported, cartpole_calib: Path) -> Exported:
    """--full-int8 (float_io_layers=False) of the CartPole PPO, in both formats."""
    out = tmp_path_factory.mktemp("full-int8") / "b"
    return _export(cartpole.policy, out, ("onnx-int8", "tflite-int8"), cartpole_calib, float_io_layers=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_full_int8_mlp_has_every_layer_int8_and_the_runner_still_feeds_float(
    fmt: str, full_int8: Exported
) -> None:
    name = f"{fmt}-int8"
    _need(full_int8, name)
    entry, path = full_int8.entry(name), full_int8.file(name)
    if fmt == "onnx":
        g = inspect_int8(path)
        assert g.float_layers == [] and g.float_weight_matrices == []
        assert len(g.int8_layers) == len(full_int8.policy.arch.hidden) + 1
        assert entry.quantization["float_nodes"] == []
        check_manifest_records(full_int8.bundle, entry, g)
    else:  # the input tensor itself int8; the adapter quantizes with the file's scale and zero point
        assert all(lay.weights == "int8" and lay.input == "int8" for lay in tflite_layers(path))
        assert tflite_io_dtypes(path)[0] == "int8"
        q = entry.quantization["input"]["quantization"]
        assert q["scale"] > 0 and -128 <= q["zero_point"] <= 127
        assert LiteRTSession(path).input_dtype == np.float32
    agree = float((full_int8.replay(name) == full_int8.policy.predict(full_int8.trace.obs)).mean())
    assert agree >= 0.9


@pytest.mark.parametrize(
    "fmt", [pytest.param("onnx", marks=pytest.mark.slow), "tflite"]
)  # the ONNX one reads the same pong bundle; slow keeps the fast tier's pong work as before
def test_pong_cnn_int8_is_int8_and_3x_smaller(fmt: str, pong: Exported) -> None:
    name = f"{fmt}-int8"
    _need(pong, name, f"{fmt}-fp32")
    entry, path = pong.entry(name), pong.file(name)
    q = entry.quantization
    # all three convolutions and the 3136x512 layer (99% of the weights) are int8, per channel (CNN default)
    assert q["per_channel"] is True and q["calibration_samples"] == PONG_CALIBRATION
    if fmt == "onnx":
        g = inspect_int8(path)
        assert len(g.int8_layers) >= 4 and len(g.int8_layers) + len(g.float_layers) == 5
        check_manifest_records(pong.bundle, entry, g)
        assert len(g.per_channel_layers) == len(g.int8_layers)
        assert entry.io["inputs"][0]["dtype"] == "uint8"  # raw frames in, the /255 lives in the graph
    else:
        layers = tflite_layers(path)
        assert [lay.op for lay in layers] == ["CONV_2D"] * 3 + ["FULLY_CONNECTED"] * 2
        int8 = [lay for lay in layers if lay.weights == "int8"]
        # int8 in, int8 weights, int8 out
        assert len(int8) == 4 and all(lay.input == lay.output == "int8" for lay in int8)
        assert all(lay.weight_scales > 1 for lay in int8)  # per-channel
        assert layers[-1].weights == "float32"  # the 512x6 output layer, like the ONNX exporter
        assert tflite_io_dtypes(path) == ("uint8", "int32")  # raw frames in, the action index out
        assert q["int8_weight_tensors"] == q["per_channel_weight_tensors"] == 4
        assert q["integer_layers"] == ["cnn.0", "cnn.2", "cnn.4", "cnn_fc.0"] and q["float_layers"] == ["out"]
        assert q["input"]["dtype"] == "uint8" and entry.io["inputs"][0]["shape"] == [1, 4, 84, 84]
        assert entry.toolchain["converter"].startswith("litert-torch ")
        assert entry.toolchain["read_back_with"].startswith("ai-edge-litert ")
    size32, size8 = pong.entry(f"{fmt}-fp32").size_bytes, entry.size_bytes
    print(
        f"\nPong Nature-CNN {fmt}: fp32 {size32 / 1024:.0f} KiB, int8 {size8 / 1024:.0f} KiB ({size32 / size8:.2f}x)"
    )
    assert size8 * 3 <= size32, f"int8 {size8} B vs fp32 {size32} B"
    actions = pong.replay(name)
    assert actions.shape == (PONG_SAMPLES,) and set(np.unique(actions)) <= set(range(6))
    agree = float((actions == pong.policy.predict(pong.trace.obs)).mean())
    print(f"zoo Pong DQN {name} action agreement with torch fp32 on {PONG_SAMPLES} frames: {agree:.3f}")
    assert agree >= INT8_AGREEMENT, agree


# ---- calibration methods and per-channel ----------------------------------------------------------------

CALIBRATIONS = [
    *[pytest.param("onnx", m, pc, id=f"onnx-{m}-{'per-channel' if pc else 'per-tensor'}")
      for m in ("minmax", "percentile", "entropy") for pc in (False, True)],
    *[pytest.param("tflite", m, False, id=f"tflite-{m}") for m in ("percentile", "entropy")],
]  # fmt: skip


@pytest.mark.parametrize(("fmt", "method", "per_channel"), CALIBRATIONS)
def test_calibration_methods_give_a_working_int8_model(
    fmt: str,
    method: str,
    per_channel: bool,
    cartpole: Exported,
    cartpole_calib: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every method, per tensor and per channel; the sample count is never assumed a multiple of the
    calibration batch (64): ONNX's default 2,000 per channel, a prime 499 per tensor, TFLite's 500."""
    name = f"{fmt}-int8"
    if _installed(name):
        pytest.skip(_installed(name) or "")
    samples = {"onnx": 2000 if per_channel or method == "minmax" else 499, "tflite": 500}[fmt]
    cfg: dict[str, Any] = dict(calibration_method=method, percentile=99.99)
    if fmt == "onnx":
        cfg["per_channel"] = per_channel
    if samples != 2000:
        cfg["max_calibration_samples"] = samples
    ex = _export(cartpole.policy, tmp_path / "b", (name,), cartpole_calib, **cfg)
    entry = ex.entry(name)
    q = entry.quantization
    assert q["calibration_method"] == method and q["calibration_samples"] == samples
    if fmt == "onnx":
        assert capsys.readouterr().out == ""  # ORT's calibrators print; stdout stays clean for --json
        assert q["percentile"] == (99.99 if method == "percentile" else None)
        assert q["per_channel"] is per_channel
        g = inspect_int8(ex.file(name))
        check_manifest_records(ex.bundle, entry, g)
        assert (len(g.per_channel_layers) > 0) is per_channel
    else:
        observer = {"percentile": "PercentileObserver", "entropy": "HistogramObserver"}[method]
        assert q["activation_observer"] == observer
    actions = ex.replay(name)
    assert actions.shape == (ex.trace.samples,)
    assert (actions == cartpole.policy.predict(ex.trace.obs)).mean() >= 0.9


def test_unknown_calibration_method_is_refused() -> None:
    with pytest.raises(InputError, match="unknown calibration method 'kl'") as ei:
        ExportConfig(calibration_method="kl")
    assert "minmax, percentile, entropy" in str(ei.value)


@pytest.mark.slow
def test_float64_observations_calibrate_and_run_int8(tmp_path: Path) -> None:
    """MuJoCo observations are float64; the graphs take float32: calibration and the runner cast."""
    root = Path(__file__).resolve().parents[1]
    policy = load_checkpoint(root / "quarl_edge/assets/policies/halfcheetah-td3")
    calib = root / "calibration_data/halfcheetah-td3.npz"
    trace = load_trace(calib)
    assert policy.spec.observation_space.dtype == "float64" and trace.obs.dtype == np.float64
    export_bundle(policy, BundleRequest(out=tmp_path / "b", targets=("onnx-fp32", "onnx-int8", "tflite-int8"),
                                        calibration=calib))  # fmt: skip
    manifest = load_manifest(tmp_path / "b")
    assert {"onnx-int8", "tflite-int8"} <= {m.name for m in manifest.models}
    obs = trace.obs[:200]
    want = policy.predict(obs.astype(np.float32))
    for name in ("onnx-int8", "tflite-int8"):
        runner = PolicyRunner(tmp_path / "b", name, threads=1)
        got = np.stack([runner.act(o) for o in obs])
        assert got.shape == want.shape
        assert np.abs(got - want).mean() < 0.1, name  # int8 actions track fp32 on the recorded states


# ---- fp16 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("which", ["cartpole", "pendulum"])
def test_fp16_has_fp16_weights_float32_io_and_acts_as_fp32(
    fmt: str, which: str, request: pytest.FixtureRequest
) -> None:
    ex: Exported = request.getfixturevalue(which)
    fp32, fp16 = f"{fmt}-fp32", f"{fmt}-fp16"
    _need(ex, fp32, fp16)
    if fmt == "onnx":
        ins16, outs16 = onnx_io_types(ex.file(fp16))
        ins32, outs32 = onnx_io_types(ex.file(fp32))
        assert ins16 == ins32 == [TensorProto.FLOAT]
        assert outs16 == outs32  # int64 actions for CartPole, float32 for Pendulum
        assert TensorProto.FLOAT16 not in outs16
        assert onnx_weight_types(ex.file(fp16)) == {TensorProto.FLOAT16}  # weights really are fp16
        assert ex.entry(fp16).io["inputs"][0]["dtype"] == "float32"
    else:
        assert "float16" in tflite_tensor_dtypes(ex.file(fp16))
        assert tflite_io_dtypes(ex.file(fp16)) == tflite_io_dtypes(ex.file(fp32))
        assert tflite_io_dtypes(ex.file(fp16))[0] == "float32"
    assert ex.entry(fp16).size_bytes < ex.entry(fp32).size_bytes
    a16, a32 = ex.replay(fp16), ex.replay(fp32)
    assert ex.trace.samples == 1000
    if which == "cartpole":
        # identical on this trace; a tie within fp16 rounding could flip one action, hence not == 1.0
        assert (a16 == a32).mean() >= 0.99
    else:
        assert a16.dtype == np.float32
        np.testing.assert_allclose(a16, a32, rtol=0, atol=0.05)  # action range is [-2, 2]


def test_fp16_onnx_pong_cnn_keeps_uint8_input_and_matches_fp32(pong: Exported) -> None:
    """The uint8 frame -> float cast stays a valid float32 cast (the converter used to retype it)."""
    fp16 = pong.entry("onnx-fp16")
    ins16, _ = onnx_io_types(pong.bundle / fp16.file)
    assert ins16 == [TensorProto.UINT8]
    assert TensorProto.FLOAT16 in onnx_weight_types(pong.bundle / fp16.file)
    a32 = pong.replay("onnx-fp32")
    a16 = pong.replay("onnx-fp16")  # loads and runs in onnxruntime
    assert_discriminating(a32, 6)
    assert (a16 == a32).mean() >= 0.95


# ---- reward, and one bench for both formats ------------------------------------------------------------


def _reward_line(report: dict[str, Any], model: str) -> tuple[float, str]:
    by = {m["name"]: m for m in report["models"]}
    ref, q = by[report["reference"]], by[model]
    assert ref["warnings"] == [] and q["warnings"] == []
    assert ref["reward"]["episodes"] == q["reward"]["episodes"] == EPISODES
    drop = q["drift"]["reward_drop_pct"] + 0.0
    f, m = ref["reward"]["mean"], q["reward"]["mean"]
    assert drop == pytest.approx(100.0 * (f - m) / abs(f), abs=1e-6)
    line = (
        f"{report['bundle']['policy']} ({EPISODES} paired seeds): {report['reference']} {f:.2f}, "
        f"{model} {m:.2f}, drop {drop:+.3f}%, keeps {100 - drop:.2f}%; "
        f"agreement {q['agreement']['metric']} = {q['agreement']['value']:.4f}"
    )
    return drop, line


def test_cartpole_int8_keeps_the_return_and_onnx_and_tflite_bench_in_one_run(cartpole: Exported) -> None:
    models = (*TFLITE, "onnx-fp32", "onnx-int8")
    _need(cartpole, *models)
    report = bench(
        cartpole.bundle, BenchConfig(episodes=EPISODES, latency_samples=200, models=models)
    ).to_dict()
    assert report["reference"] == "tflite-fp32"
    rows = {m["name"]: m for m in report["models"]}
    assert list(rows) == list(models)
    for name, m in rows.items():
        assert m["format"] == name.split("-")[0] and m["precision"] == name.split("-")[1]
        assert m["runtime"].startswith("ai-edge-litert" if m["format"] == "tflite" else "onnxruntime")
        assert m["latency"]["count"] == 200 and m["speedup_p50_vs_ref"] > 0
        assert m["reward"]["episodes"] == EPISODES
        if name != "tflite-fp32":
            assert m["agreement"]["samples"] == 1000 and m["drift"]["paired_episodes"] == EPISODES
    # the same seeds for every model, whatever its format
    assert rows["onnx-fp32"]["reward"]["per_episode"] == rows["tflite-fp32"]["reward"]["per_episode"]
    drop, line = _reward_line(report, "tflite-int8")
    print("\n" + line)
    print("  p50 us: " + ", ".join(f"{n} {m['latency']['p50_us']:.1f}" for n, m in rows.items()))
    assert drop <= MAX_DROP_PCT


def test_pendulum_int8_keeps_98_percent_of_fp32_return(pendulum: Exported) -> None:
    _need(pendulum, *TFLITE)
    cfg = BenchConfig(episodes=EPISODES, latency_samples=100, models=TFLITE)
    report = bench(pendulum.bundle, cfg).to_dict()
    assert report["reference"] == "tflite-fp32"
    drop, line = _reward_line(report, "tflite-int8")
    print("\n" + line)
    assert drop <= MAX_DROP_PCT
    # the check can fail: Pendulum's returns spread widely over seeds (unlike CartPole's 500s), and on
    # each paired seed int8's return stays close to fp32's, far closer than one seed is to another
    by = {m["name"]: np.asarray(m["reward"]["per_episode"]) for m in report["models"]}
    ref, q = by["tflite-fp32"], by["tflite-int8"]
    assert len(set(ref.tolist())) == EPISODES and ref.std() > 50, ref
    assert np.median(np.abs(q - ref)) < 0.1 * ref.std(), (ref, q)
    # and a mutation: the same episodes paired with other seeds' returns would fail that bound
    assert np.median(np.abs(np.roll(q, 1) - ref)) > 0.1 * ref.std()


# ---- bad input --------------------------------------------------------------------------------------


class Erfinv(nn.Module):
    """An op LiteRT has no lowering for (aten.erfinv)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.erfinv(torch.tanh(x) * 0.5)


@pytest.mark.parametrize("target", ["tflite-fp32", "tflite-int8"])
def test_an_op_litert_cannot_convert_names_the_layer(
    target: str, cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    policy = load_checkpoint(cartpole_policy)
    policy.net.mlp[1] = Erfinv()
    out = tmp_path / "b"
    with pytest.raises(InputError) as ei:
        export_bundle(policy, BundleRequest(out=out, targets=(target,), calibration=cartpole_calib))
    msg = str(ei.value)
    assert "\n" not in msg
    assert "layer 'mlp.1' (Erfinv)" in msg and "erfinv" in msg and "ONNX" in msg
    assert_absent(out)


def _blocked_env(tmp_path: Path, blocked: tuple[str, ...]) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=blocked))
    log = tmp_path / "imports.log"
    return dict(
        os.environ, PYTHONPATH=str(site), QUARL_IMPORT_LOG=str(log), PYTHONWARNINGS="ignore", COLUMNS="200"
    )


def test_missing_tflite_extra_gives_the_install_command(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    """As if the tflite extra were not installed: litert_torch and the LiteRT runtime import nowhere."""
    env = _blocked_env(tmp_path, ("litert_torch", "ai_edge_litert", "tflite_runtime", "tensorflow"))
    out = tmp_path / "b"
    p = subprocess.run(
        [sys.executable, "-m", "quarl_edge.cli", "export", "--policy", str(cartpole_policy),
         "--calibration", str(cartpole_calib), "--to", "onnx-fp32,tflite-int8", "--out", str(out)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    line = assert_one_error(p)
    assert "tflite-int8" in line and "pip install 'quarl-edge[tflite]'" in line
    assert_absent(out)
    assert "blocked litert_torch" in (tmp_path / "imports.log").read_text()  # the blocker was asked


def test_device_without_a_tflite_runtime_runs_onnx_and_names_the_install_for_tflite(
    cartpole: Exported, tmp_path: Path
) -> None:
    env = _blocked_env(tmp_path, ("torch", "tensorflow", "ai_edge_litert", "tflite_runtime"))

    def run(model: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "quarl_edge.runtimes", "run", "--bundle", str(cartpole.bundle),
             "--model", model, "--seeds", "1", "--latency-samples", "20"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    ok = run("onnx-int8")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout.splitlines()[-1])["event"] == "result"
    bad = run("tflite-int8")
    assert bad.returncode == 2
    err = json.loads(bad.stdout.splitlines()[-1])
    assert err["event"] == "error" and err["kind"] == "MissingDependencyError"
    assert (
        "no TFLite runtime is installed" in err["message"] and "pip install ai-edge-litert" in err["message"]
    )


def test_device_runner_runs_tflite_without_torch_or_tensorflow(pong: Exported, tmp_path: Path) -> None:
    env = _blocked_env(tmp_path, ("torch", "tensorflow"))
    p = subprocess.run(
        [sys.executable, "-m", "quarl_edge.runtimes", "run", "--bundle", str(pong.bundle),
         "--model", "tflite-int8", "--seeds", "", "--latency-samples", "20"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.splitlines()[-1])["result"]
    assert result["runtime"].startswith("ai-edge-litert") and result["torch_imported"] is False
    assert len(result["replay_actions"]) == PONG_SAMPLES and set(result["replay_actions"]) <= set(range(6))
    log = (tmp_path / "imports.log").read_text()
    assert "quarl_edge.runtimes.litert" in log and " for quarl_edge" not in log


def _rehash(bundle: Path, file: str) -> None:
    """Make the manifest agree with a damaged file, so that only the load itself can refuse it."""
    manifest = json.loads((bundle / MANIFEST_NAME).read_text())
    data = (bundle / file).read_bytes()
    for m in manifest["models"]:
        if m["file"] == file:
            m["sha256"], m["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (bundle / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("fix_manifest", [False, True], ids=["hash-mismatch", "hash-matches"])
def test_bench_refuses_a_truncated_tflite(
    fix_manifest: bool, cli: Any, pendulum: Exported, tmp_path: Path
) -> None:
    bundle = Path(shutil.copytree(pendulum.bundle, tmp_path / "bundle"))
    f = bundle / "policy.int8.tflite"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    if fix_manifest:
        _rehash(bundle, f.name)
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle, *FAST_BENCH, "--out", report))
    assert "policy.int8.tflite" in line
    assert ("not a loadable TFLite model" if fix_manifest else "sha256 mismatch") in line
    assert_no_report(report)


def test_bench_refuses_a_tflite_for_another_observation_shape(
    cli: Any, pendulum: Exported, cartpole: Exported, tmp_path: Path
) -> None:
    """A CartPole model (4 inputs) where the Pendulum bundle (3) expects its own, hashes made to match."""
    bundle = Path(shutil.copytree(pendulum.bundle, tmp_path / "bundle"))
    shutil.copyfile(cartpole.file("tflite-int8"), bundle / "policy.int8.tflite")
    _rehash(bundle, "policy.int8.tflite")
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle, *FAST_BENCH, "--out", report))
    assert "policy.int8.tflite" in line and "expects observations of shape [4]" in line and "[3]" in line
    assert_no_report(report)


@pytest.mark.slow
def test_cli_export_tflite_keeps_stdout_clean_for_json(
    cli: Any, cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    out = tmp_path / "b"
    p = cli("export", "--policy", cartpole_policy, "--calibration", cartpole_calib,
            "--to", "tflite-fp32,tflite-int8", "--out", out, "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    manifest = json.loads(p.stdout)  # nothing but the manifest on stdout: no converter chatter
    assert [m["name"] for m in manifest["models"]] == ["tflite-fp32", "tflite-int8"]
    assert sorted(f.name for f in out.iterdir()) == [
        "manifest.json",
        "policy.fp32.tflite",
        "policy.int8.tflite",
        "trace.npz",
    ]


def test_a_policy_changed_between_two_exports_is_exported_afresh(
    cartpole_policy: Path, tmp_path: Path
) -> None:
    """Within a bundle the fp32 ONNX graph is exported once and copied for the other ONNX targets
    (exporters/onnx.py); a second bundle of the same policy object exports it again: the same bytes for
    the same policy, the new weight after a change in place (tests/test_dict_images.py breaks a module's
    plain attributes the same way)."""
    policy = load_checkpoint(cartpole_policy)

    def graph(p: Policy, name: str) -> bytes:
        export_bundle(p, BundleRequest(out=tmp_path / name, targets=("onnx-fp32",), calibration=None))
        return (tmp_path / name / "policy.fp32.onnx").read_bytes()

    first = graph(policy, "a")
    assert graph(policy, "b") == first
    with torch.no_grad():
        policy.net.out.bias.add_(0.5)
    changed = graph(policy, "c")
    assert changed != first
    biases = [numpy_helper.to_array(t) for t in onnx.load_from_string(changed).graph.initializer]
    assert any(np.allclose(b, policy.net.out.bias.detach().numpy()) for b in biases if b.shape == (2,))
