"""The runtime API's batch call, ONNX Runtime session options, the tuned-on-another-device warning and a
quiet LiteRT load, on real sessions of zoo bundles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from quarl_edge.runtimes import DeviceMismatchWarning, OrtOptions, load_policy
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.litert import _without_info_lines
from quarl_edge.runtimes.trace import load_trace

MODELS = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")


def one_line(e: QuarlError) -> str:
    text = str(e)
    assert "\n" not in text and "; " in text, text
    return text


# ---- act_batch: N observations, one call, the same actions as N act() calls ---------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("which", ["cartpole_rt_bundle", "pendulum_rt_bundle"])
def test_act_batch_equals_one_act_per_observation(
    which: str, model: str, request: pytest.FixtureRequest
) -> None:
    bundle: Path = request.getfixturevalue(which)
    obs = load_trace(bundle / "trace.npz").obs[:64]
    one = load_policy(bundle, model=model)
    want = [one.act(o) for o in obs]
    got = load_policy(bundle, model=model).act_batch(obs)
    if which == "cartpole_rt_bundle":
        assert got.dtype == np.int64 and got.shape == (64,) and got.tolist() == want
        assert len(set(want)) == 2  # both actions: equality is not a constant's
    else:
        assert got.dtype == np.float32 and got.shape == (64, 1)
        np.testing.assert_array_equal(got, np.stack(want))
        assert len(np.unique(got)) > 32
    assert load_policy(bundle, model=model).act_batch(list(obs)).tolist() == got.tolist()  # lists too


def test_act_batch_on_a_frame_stacked_policy_takes_stacked_rows(pong_rt_bundle: Path) -> None:
    obs = load_trace(pong_rt_bundle / "trace.npz").obs[:16]
    for model in ("onnx-int8", "tflite-int8"):
        policy = load_policy(pong_rt_bundle, model=model)
        want = [policy.act_on_input(o) for o in obs]
        assert policy.act_batch(obs).tolist() == want and len(set(want)) >= 2
        with pytest.raises(InputError) as e:  # frames without their stack
            policy.act_batch(obs[:, -1])
        assert "the policy takes [N, 4, 84, 84]" in one_line(e.value)


def test_act_batch_checks_every_row(cartpole_rt_bundle: Path) -> None:
    obs = load_trace(cartpole_rt_bundle / "trace.npz").obs[:8].copy()
    policy = load_policy(cartpole_rt_bundle, model="onnx-int8")
    assert policy.act_batch(obs[:0]).shape == (0,)
    for bad, says in [(obs[0], "batch of shape [4], the policy takes [N, 4]"),
                      (obs[:, :3], "batch of shape [8, 3]"), (obs.astype(complex), "complex numbers"),
                      (obs.astype(str), "strings")]:  # fmt: skip
        with pytest.raises(InputError) as e:
            policy.act_batch(bad)
        assert says in one_line(e.value)
    obs[5, 2] = np.nan
    with pytest.raises(InputError) as e:
        policy.act_batch(obs)
    assert "row 5 of the batch holds NaN or inf" in one_line(e.value)
    assert policy.stats.refused == 1 + 8 + 8 + 8 + 8 and policy.stats.nonfinite == 1

    holding = load_policy(cartpole_rt_bundle, model="onnx-int8", on_nonfinite="hold")
    with pytest.raises(InputError, match="no previous batch of 8 to hold"):
        holding.act_batch(obs)
    good = load_trace(cartpole_rt_bundle / "trace.npz").obs[8:16]
    before = holding.act_batch(good)
    fresh = holding.act_batch(obs)  # row 5 holds NaN: it gets row 5 of the previous batch
    want = load_policy(cartpole_rt_bundle, model="onnx-int8").act_batch(np.nan_to_num(obs))
    assert fresh[5] == before[5] and np.delete(fresh, 5).tolist() == np.delete(want, 5).tolist()
    assert holding.stats.held == 1


# ---- ONNX Runtime session options ----------------------------------------------------------------------


def test_session_options_reach_the_onnx_runtime_session(cartpole_rt_bundle: Path) -> None:
    spin = {"session.intra_op.allow_spinning": "0"}
    for options in (OrtOptions(graph_optimization_level="basic", config=spin),
                    {"graph_optimization_level": "basic", "providers": ["CPUExecutionProvider"], "config": spin}):  # fmt: skip
        policy = load_policy(cartpole_rt_bundle, model="onnx-int8", session_options=options)
        sess = policy.session._sess  # type: ignore[attr-defined]
        opts = sess.get_session_options()
        assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert sess.get_providers() == ["CPUExecutionProvider"]
        assert policy.act(np.zeros(4, np.float32)) in (0, 1)
    default = load_policy(cartpole_rt_bundle, model="onnx-int8").session._sess  # type: ignore[attr-defined]
    assert default.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


@pytest.mark.parametrize(
    ("options", "says"),
    [({"graph_optimization_level": "max"}, "graph_optimization_level 'max' is not one of"),
     ({"providers": ["NoSuchExecutionProvider"]}, "has no provider 'NoSuchExecutionProvider'"),
     ({"providers": "CPUExecutionProvider"}, "providers is not a non-empty list"),
     ({"threads": 4}, "unknown session option 'threads'"),
     ({"config": {"k": 1}}, "session config is not a mapping"),
     (ort.SessionOptions(), "is not OrtOptions or a dict")],
)  # fmt: skip
def test_bad_session_options_are_one_line_errors(
    cartpole_rt_bundle: Path, options: object, says: str
) -> None:
    with pytest.raises(InputError) as e:
        load_policy(cartpole_rt_bundle, model="onnx-int8", session_options=options)  # type: ignore[arg-type]
    assert says in one_line(e.value)


def test_session_options_for_a_litert_model_are_refused(cartpole_rt_bundle: Path) -> None:
    with pytest.raises(InputError) as e:
        load_policy(
            cartpole_rt_bundle, model="tflite-int8", session_options={"graph_optimization_level": "basic"}
        )
    assert "ONNX Runtime's; this model runs on LiteRT" in one_line(e.value)


# ---- a bundle tuned on one device, loaded on another ---------------------------------------------------


@pytest.fixture
def tuned_on_rpi4(cartpole_rt_bundle: Path, tmp_path: Path) -> Path:
    bundle = tmp_path / "tuned"
    shutil.copytree(cartpole_rt_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["tune"] = {"chosen": "tflite-int8", "threads": 1, "device": "rpi4", "emulated": False}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle


def test_loading_a_bundle_tuned_elsewhere_warns_once(
    tuned_on_rpi4: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QUARL_EDGE_DEVICE", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_policy(tuned_on_rpi4, device="rpi5").info.device == "rpi5"
    (w,) = caught
    assert w.category is DeviceMismatchWarning and w.filename == __file__  # points at the caller's line
    assert "\n" not in str(w.message) and "'rpi4'" in str(w.message) and "--device rpi5" in str(w.message)
    monkeypatch.setenv("QUARL_EDGE_DEVICE", "rpi5")
    with pytest.warns(DeviceMismatchWarning):
        load_policy(tuned_on_rpi4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the same device, or no device named
        load_policy(tuned_on_rpi4, device="rpi4")
        monkeypatch.delenv("QUARL_EDGE_DEVICE")
        assert load_policy(tuned_on_rpi4).info.device is None


# ---- LiteRT loads quietly ------------------------------------------------------------------------------


def test_a_litert_load_prints_nothing_on_stderr(cartpole_rt_bundle: Path, tmp_path: Path) -> None:
    model = cartpole_rt_bundle / "policy.int8.tflite"
    code = {  # the interpreter alone prints the line; load_policy must not
        "bare": "from ai_edge_litert.interpreter import Interpreter\n"
        f"i = Interpreter(model_path={str(model)!r}, num_threads=1); i.allocate_tensors()\n",
        "load_policy": "import numpy as np\nfrom quarl_edge.runtimes import load_policy\n"
        f"p = load_policy({str(cartpole_rt_bundle)!r}, model='tflite-int8')\n"
        "print(p.act(np.zeros(4, np.float32)))\n",
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    runs = {k: subprocess.run([sys.executable, "-c", c], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
            for k, c in code.items()}  # fmt: skip
    assert "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." in runs["bare"].stderr
    assert runs["load_policy"].returncode == 0 and runs["load_policy"].stdout.strip() in ("0", "1")
    assert runs["load_policy"].stderr == ""


def test_the_quiet_load_keeps_what_is_not_an_info_line(capfd: pytest.CaptureFixture[str]) -> None:
    with _without_info_lines():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\nERROR: a real problem\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "ERROR: a real problem\nafter\n"
