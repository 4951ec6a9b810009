"""The runtime's input contract (runtimes/inputs.py) on real ONNX Runtime and LiteRT sessions of zoo
bundles: every kind of bad observation refused before the model sees it, NaN/inf held on request, the
calibration range recorded at export and validated where read, and the thread count bounded."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quarl_edge.exporters.base import ExportConfig
from quarl_edge.runtimes import PolicyStats, load_policy
from quarl_edge.runtimes.adapters import MAX_THREADS
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.selection import available_cores
from quarl_edge.runtimes.trace import load_trace

MODELS = ("onnx-int8", "tflite-int8")


def one_line(e: QuarlError) -> str:
    text = str(e)
    assert "\n" not in text and "; " in text, text  # the problem; the fix
    return text


def pong_frames(bundle: Path, n: int = 8) -> np.ndarray:
    """Real 84x84 uint8 frames: the newest frame of each of the first recorded stacked observations."""
    return load_trace(bundle / "trace.npz").obs[:n, -1]


def with_pixel(frame: np.ndarray, value: float) -> np.ndarray:
    x = frame.astype(np.float64)
    x[40, 40] = value
    return x


Case = tuple[str, Callable[[np.ndarray], Any], str]

FRAME_CASES: list[Case] = [  # (name, bad observation made from a real frame, what the error says)
    ("nan", lambda f: with_pixel(f, np.nan), "NaN or inf"),
    ("inf", lambda f: with_pixel(f, np.inf), "NaN or inf"),
    ("string", lambda f: f.astype(str), "strings"),
    ("complex", lambda f: f.astype(np.complex128), "complex numbers"),
    ("object", lambda f: f.astype(object), "Python objects"),
    ("bool", lambda f: f > 100, "booleans"),
    ("float-0-1", lambda f: f / 255.0, "values in [0, 1]"),
    ("frame-of-256", lambda f: np.full(f.shape, 256.0), "holds 256, outside uint8's 0-255"),
    ("int-256", lambda f: np.full(f.shape, 256, np.int64), "holds 256, outside uint8's 0-255"),
    ("minus-1", lambda f: with_pixel(f, -1.0), "spans -1 to"),
    ("255.5", lambda f: with_pixel(f, 255.5), "to 255.5, outside uint8's 0-255"),
    ("half", lambda f: with_pixel(f, 100.5), "holds 100.5, not a whole number"),
    ("wrong-shape", lambda f: f[:, :80], "observation of shape [84, 80], the policy takes [84, 84]"),
    ("stacked", lambda f: np.stack([f] * 4), "observation of shape [4, 84, 84], the policy takes [84, 84]"),
    ("ragged", lambda f: [[1, 2], [3]], "not an array of numbers"),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", FRAME_CASES, ids=[c[0] for c in FRAME_CASES])
def test_a_uint8_frame_policy_refuses_each_bad_input(pong_rt_bundle: Path, model: str, case: Case) -> None:
    _, make, says = case
    frames = pong_frames(pong_rt_bundle, 2)
    policy = load_policy(pong_rt_bundle, model=model)
    with pytest.raises(InputError) as e:
        policy.act(make(frames[0]))
    assert says in one_line(e.value)
    if case[0] == "float-0-1":
        assert "the policy takes raw 0-255 uint8 frames" in str(e.value)
    assert (policy.stats.observations, policy.stats.refused) == (1, 1)
    assert policy.act(frames[1]) in range(6)  # refused, not broken


@pytest.mark.parametrize("model", MODELS)
def test_a_frame_that_was_refused_never_reaches_the_frame_stack(pong_rt_bundle: Path, model: str) -> None:
    frames = pong_frames(pong_rt_bundle, 12)
    clean, dirty = load_policy(pong_rt_bundle, model=model), load_policy(pong_rt_bundle, model=model)
    want, got = [], []
    for i, f in enumerate(frames):
        want.append(clean.act(f))
        for _, make, _ in FRAME_CASES[i % len(FRAME_CASES) :][:2]:
            with pytest.raises(InputError):
                dirty.act(make(f))
        got.append(dirty.act(f))
    assert got == want and len(set(want)) >= 2, want  # the actions vary: equal stacks, not a constant
    assert dirty.stats.refused == 2 * len(frames)


@pytest.mark.parametrize("model", MODELS)
def test_a_float_or_int64_frame_of_whole_numbers_is_the_uint8_frame(pong_rt_bundle: Path, model: str) -> None:
    frames = pong_frames(pong_rt_bundle)
    a, b, c = (load_policy(pong_rt_bundle, model=model) for _ in range(3))
    for f in frames:
        assert a.act(f) == b.act(f.astype(np.float32)) == c.act(f.astype(np.int64))
    assert b.stats.refused == c.stats.refused == 0


VECTOR_CASES: list[Case] = [
    ("nan", lambda o: np.where(np.arange(o.size) == 1, np.nan, o), "NaN or inf"),
    ("inf", lambda o: np.where(np.arange(o.size) == 0, np.inf, o), "NaN or inf"),
    ("minus-inf", lambda o: np.where(np.arange(o.size) == 2, -np.inf, o), "NaN or inf"),
    ("string", lambda o: "0.1 0.2 0.3 0.4", "strings"),
    ("string-array", lambda o: o.astype(str), "strings"),
    ("complex", lambda o: o.astype(np.complex64), "complex numbers"),
    ("object", lambda o: np.array([*o.tolist()[:-1], None], dtype=object), "Python objects"),
    ("none", lambda o: None, "Python objects"),
    ("bool", lambda o: o > 0, "booleans"),
    ("wrong-shape", lambda o: np.append(o, 0.0), "observation of shape [5], the policy takes [4]"),
    ("batch-of-one", lambda o: o[None], "observation of shape [1, 4], the policy takes [4]"),
    ("ragged", lambda o: [[0.1, 0.2], [0.3]], "not an array of numbers"),
]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", VECTOR_CASES, ids=[c[0] for c in VECTOR_CASES])
def test_a_vector_policy_refuses_each_bad_input(cartpole_rt_bundle: Path, model: str, case: Case) -> None:
    _, make, says = case
    obs = load_trace(cartpole_rt_bundle / "trace.npz").obs[0]
    policy = load_policy(cartpole_rt_bundle, model=model)
    with pytest.raises(InputError) as e:
        policy.act(make(obs))
    assert says in one_line(e.value)
    assert policy.stats.refused == 1 and policy.act(obs) in (0, 1)
    with pytest.raises(InputError):  # a trace's model input goes through the same contract
        policy.act_on_input(make(obs))


@pytest.mark.parametrize("model", MODELS)
def test_hold_repeats_the_last_action_for_nan_and_inf_and_counts_it(
    pendulum_rt_bundle: Path, model: str
) -> None:
    obs = load_trace(pendulum_rt_bundle / "trace.npz").obs[:3]
    policy = load_policy(pendulum_rt_bundle, model=model, on_nonfinite="hold")
    bad = np.array([np.nan, 0.0, np.inf], np.float32)
    with pytest.raises(InputError) as e:  # nothing to hold yet
        policy.act(bad)
    assert "no earlier action to hold" in one_line(e.value)
    first = policy.act(obs[0])
    held = policy.act(bad)
    np.testing.assert_array_equal(held, first)
    assert held is not first and isinstance(held, np.ndarray) and held.dtype == np.float32
    np.testing.assert_array_equal(policy.act(np.array([0.0, 0.0, np.inf], np.float32)), first)
    s = policy.stats
    assert (s.observations, s.nonfinite, s.held, s.refused) == (4, 3, 2, 1)
    policy.reset()  # a new episode: the last one's action is not carried over
    with pytest.raises(InputError, match="no earlier action to hold"):
        policy.act(bad)
    strict = load_policy(pendulum_rt_bundle, model=model)  # the default refuses, naming the opt-in
    strict.act(obs[0])
    with pytest.raises(InputError) as e:
        strict.act(bad)
    assert "on_nonfinite='hold'" in one_line(e.value)


# ---- the calibration range: recorded at export, validated where read ----------------------------------


@pytest.mark.parametrize(("which", "calib"), [("cartpole_rt_bundle", "cartpole_calib"),
                                              ("pendulum_rt_bundle", "pendulum_calib")])  # fmt: skip
def test_the_manifest_records_the_calibration_range_per_feature(
    which: str, calib: str, request: pytest.FixtureRequest
) -> None:
    bundle: Path = request.getfixturevalue(which)
    block = json.loads((bundle / "manifest.json").read_text())["calibration"]["range"]
    # the observations the models were calibrated on: the export's subsample of the file (samples_used)
    obs = (
        load_trace(request.getfixturevalue(calib))
        .subsample(ExportConfig().max_calibration_samples, seed=1)
        .obs
    )
    obs = obs[np.all(np.isfinite(obs), axis=1)]
    assert len(obs) == json.loads((bundle / "manifest.json").read_text())["calibration"]["samples_used"]
    assert block["low"] == obs.min(axis=0).tolist() and block["high"] == obs.max(axis=0).tolist()
    assert load_policy(bundle, model="onnx-int8").stats.calibration_range


def test_a_frame_policy_records_one_range_over_all_pixels(
    pong_rt_bundle: Path, zoo_pong: tuple[Path, Path]
) -> None:
    block = json.loads((pong_rt_bundle / "manifest.json").read_text())["calibration"]["range"]
    frames = load_trace(zoo_pong[1]).obs
    assert block == {"low": [int(frames.min())], "high": [int(frames.max())]}
    policy = load_policy(pong_rt_bundle, model="onnx-int8")
    dark = np.full((84, 84), max(block["low"][0] - 1, 0), np.uint8)
    policy.act(dark)
    assert (policy.stats.out_of_range, policy.stats.out_of_range_features) == (1, (1,))


BAD_RANGES: list[tuple[str, Any]] = [
    ("nan", {"low": [float("nan"), 0, 0, 0], "high": [1, 1, 1, 1]}),
    ("inf", {"low": [0, 0, 0, 0], "high": [1, 1, float("inf"), 1]}),
    ("low-above-high", {"low": [0, 2, 0, 0], "high": [1, 1, 1, 1]}),
    ("wrong-length", {"low": [0, 0, 0], "high": [1, 1, 1]}),
    ("lengths-differ", {"low": [0], "high": [1, 1, 1, 1]}),
    ("strings", {"low": ["0", 0, 0, 0], "high": [1, 1, 1, 1]}),
    ("not-an-object", [0, 1]),
    ("huge", {"low": [0] * 100_000, "high": [1] * 100_000}),
]


@pytest.mark.parametrize("case", BAD_RANGES, ids=[c[0] for c in BAD_RANGES])
def test_a_damaged_calibration_range_is_refused_at_load(
    cartpole_rt_bundle: Path, tmp_path: Path, case: tuple[str, Any]
) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(cartpole_rt_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["calibration"]["range"] = case[1]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError) as e:
        load_policy(bundle, model="onnx-int8")
    assert "calibration.range" in one_line(e.value) and "re-export" in str(e.value)


def test_a_bundle_without_a_range_still_checks_nan_and_cannot_clip(
    cartpole_rt_bundle: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "old"
    shutil.copytree(cartpole_rt_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["calibration"]["range"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    policy = load_policy(bundle, model="onnx-int8")
    assert policy.act(np.full(4, 50.0, np.float32)) in (0, 1)
    with pytest.raises(InputError, match="NaN or inf"):
        policy.act(np.full(4, np.nan, np.float32))
    assert not policy.stats.calibration_range and policy.stats.out_of_range == 0
    with pytest.raises(InputError) as e:
        load_policy(bundle, model="onnx-int8", on_out_of_range="clip")
    assert "records none" in one_line(e.value)


def test_stats_are_a_frozen_snapshot(cartpole_rt_bundle: Path) -> None:
    policy = load_policy(cartpole_rt_bundle, model="onnx-int8")
    before = policy.stats
    policy.act(np.zeros(4, np.float32))
    assert isinstance(before, PolicyStats) and before.observations == 0 and policy.stats.observations == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.observations = 5  # type: ignore[misc]
    with pytest.raises(ValueError):
        PolicyStats(-1, 0, 0, 0, 0, (), 0, 0, True)


# ---- threads: bounded by the device's cores ---------------------------------------------------------


@pytest.mark.parametrize("threads", [10**6, 2**31, MAX_THREADS + 1])
def test_absurd_thread_counts_are_one_line_errors(cartpole_rt_bundle: Path, threads: int) -> None:
    for model in MODELS:
        for oversubscribe in (False, True):
            with pytest.raises(InputError) as e:
                load_policy(cartpole_rt_bundle, model=model, threads=threads, oversubscribe=oversubscribe)
            assert f"threads={threads}" in one_line(e.value)


def test_threads_past_the_cores_need_oversubscribe(cartpole_rt_bundle: Path) -> None:
    cores = available_cores()
    with pytest.raises(InputError) as e:
        load_policy(cartpole_rt_bundle, model="onnx-int8", threads=cores + 1)
    assert f"more than the {cores} cores" in one_line(e.value) and "oversubscribe=True" in str(e.value)
    for model in MODELS:
        policy = load_policy(cartpole_rt_bundle, model=model, threads=cores + 1, oversubscribe=True)
        assert policy.info.threads == cores + 1 and policy.act(np.zeros(4, np.float32)) in (0, 1)
    for bad in ("many", 1.5, True, None, 0, -1):
        with pytest.raises(InputError) as e:
            load_policy(cartpole_rt_bundle, model="onnx-int8", threads=bad)  # type: ignore[arg-type]
        one_line(e.value)


@pytest.mark.parametrize("recorded", [10**6, -1, "4", 1.5])
def test_a_tune_block_thread_count_is_checked_when_the_manifest_is_read(
    cartpole_rt_bundle: Path, tmp_path: Path, recorded: Any
) -> None:
    bundle = tmp_path / "tuned"
    shutil.copytree(cartpole_rt_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["tune"] = {"chosen": "onnx-int8", "threads": recorded, "device": "rpi4"}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    for threads in ("tune", 1):  # a damaged tune block is a damaged manifest, whatever the count asked for
        with pytest.raises(InputError) as e:
            load_policy(bundle, threads=threads)
        assert "bundle manifest tune.threads is not an integer in [1, " in one_line(e.value)


def test_a_tuned_count_above_the_cores_is_capped_with_a_warning(
    cartpole_rt_bundle: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "tuned"
    shutil.copytree(cartpole_rt_bundle, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    cores = available_cores()
    manifest["tune"] = {"chosen": "tflite-int8", "threads": cores + 2, "device": "big-board"}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = load_policy(bundle).info
    assert (info.model, info.threads, info.threads_from) == (
        "tflite-int8",
        cores,
        "tune, capped to the cores",
    )
    (w,) = caught
    assert "\n" not in str(w.message) and f"tuned at {cores + 2} threads" in str(w.message)


@pytest.mark.parametrize(
    "kwargs",
    [{"warmup": -1}, {"warmup": "3"}, {"on_nonfinite": "ignore"}, {"on_out_of_range": "fp16"},
     {"on_out_of_range": None}, {"oversubscribe": "yes"}, {"device": 7}, {"device": "a\nb"}, {"device": ""},
     {"session_options": 5}, {"model": "tflite-fp16"}],
)  # fmt: skip
def test_every_bad_argument_is_a_one_line_quarl_error(
    cartpole_rt_bundle: Path, kwargs: dict[str, Any]
) -> None:
    kwargs = {"model": "onnx-int8", **kwargs}
    with pytest.raises(QuarlError) as e:
        load_policy(cartpole_rt_bundle, **kwargs)
    one_line(e.value)


def test_a_bundle_that_is_not_a_path_is_a_one_line_error() -> None:
    for bundle in (123, None, ["bundles/x"]):
        with pytest.raises(InputError) as e:
            load_policy(bundle)  # type: ignore[arg-type]
        assert "bundle must be a folder path" in one_line(e.value)
