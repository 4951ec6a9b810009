"""Out-of-calibration-range monitoring (issue 32): a continuous zoo policy fed observations far outside the
range its int8 model was calibrated on is counted per feature, and ``on_out_of_range`` clips them or has
the bundle's fp32 model answer, on real ONNX Runtime and LiteRT sessions, one step or a batch at a time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.trace import load_trace

PAIRS = [("onnx-int8", "onnx-fp32"), ("tflite-int8", "tflite-fp32")]
SPEED, COS = 2, 0  # Pendulum's observation: cos, sin, angular velocity (calibrated within about +-7.2)


def field_observations(bundle: Path) -> tuple[np.ndarray, np.ndarray]:
    """64 recorded observations where every odd row's angular velocity is far outside the calibration
    range (a sensor gain error) and every 4th row's cos too (a bias); and the mask of those odd rows."""
    obs = load_trace(bundle / "trace.npz").obs[:64].astype(np.float32)
    rows = np.arange(len(obs))
    far = rows % 2 == 1
    obs[far, SPEED] = np.where(obs[far, SPEED] >= 0, 1, -1) * (np.abs(obs[far, SPEED]) * 3 + 20)
    obs[rows % 4 == 3, COS] = 1.5
    return obs, far


def calibration_bounds(bundle: Path) -> tuple[np.ndarray, np.ndarray]:
    block = json.loads((bundle / "manifest.json").read_text())["calibration"]["range"]
    return np.asarray(block["low"]), np.asarray(block["high"])


@pytest.mark.parametrize(("int8", "fp32"), PAIRS)
def test_out_of_range_observations_are_counted_per_feature(
    pendulum_rt_bundle: Path, int8: str, fp32: str
) -> None:
    obs, far = field_observations(pendulum_rt_bundle)
    policy = load_policy(pendulum_rt_bundle, model=int8)
    for o in obs:
        policy.act(o)
    s = policy.stats
    assert (s.observations, s.out_of_range, s.out_of_range_features) == (64, 32, (16, 0, 32))
    assert s.out_of_range_rate == 0.5 and (s.clipped, s.fp32_steps, s.refused) == (0, 0, 0)
    batched = load_policy(pendulum_rt_bundle, model=int8)
    batched.act_batch(obs)
    assert batched.stats == s


@pytest.mark.parametrize(("int8", "fp32"), PAIRS)
def test_fp32_answers_the_out_of_range_steps(pendulum_rt_bundle: Path, int8: str, fp32: str) -> None:
    obs, far = field_observations(pendulum_rt_bundle)
    quantized = np.array([load_policy(pendulum_rt_bundle, model=int8).act(o) for o in obs])
    reference = np.array([load_policy(pendulum_rt_bundle, model=fp32).act(o) for o in obs])
    # what makes the option worth having: int8, clipped to its calibrated activations, departs from fp32
    assert np.abs(quantized[far] - reference[far]).max() > 0.1
    guarded = load_policy(pendulum_rt_bundle, model=int8, on_out_of_range="fp32")
    assert guarded.info.fp32_model == fp32
    got = np.array([guarded.act(o) for o in obs])
    np.testing.assert_array_equal(got[far], reference[far])  # fp32's action on the out-of-range steps
    np.testing.assert_array_equal(got[~far], quantized[~far])  # int8's on the others
    assert (guarded.stats.fp32_steps, guarded.stats.out_of_range) == (32, 32)
    batch = load_policy(pendulum_rt_bundle, model=int8, on_out_of_range="fp32").act_batch(obs)
    np.testing.assert_array_equal(batch, got)


@pytest.mark.parametrize(("int8", "fp32"), PAIRS)
def test_clip_runs_the_model_on_the_clipped_observation(
    pendulum_rt_bundle: Path, int8: str, fp32: str
) -> None:
    obs, far = field_observations(pendulum_rt_bundle)
    low, high = calibration_bounds(pendulum_rt_bundle)
    plain = load_policy(pendulum_rt_bundle, model=int8)
    want = np.array([plain.act(np.clip(o, low, high)) for o in obs])
    clipping = load_policy(pendulum_rt_bundle, model=int8, on_out_of_range="clip")
    got = np.array([clipping.act(o) for o in obs])
    np.testing.assert_array_equal(got, want)
    assert (clipping.stats.clipped, clipping.stats.out_of_range_features) == (32, (16, 0, 32))
    clipped_batch = load_policy(pendulum_rt_bundle, model=int8, on_out_of_range="clip")
    np.testing.assert_array_equal(clipped_batch.act_batch(obs), want)


def test_fp32_without_an_fp32_model_is_refused_at_load(pong_rt_bundle: Path) -> None:
    with pytest.raises(Exception) as e:
        load_policy(pong_rt_bundle, model="onnx-int8", on_out_of_range="fp32")
    assert "needs the bundle's fp32 model" in str(e.value) and "\n" not in str(e.value)


def test_an_fp32_model_answers_for_itself(pendulum_rt_bundle: Path) -> None:
    obs, far = field_observations(pendulum_rt_bundle)
    policy = load_policy(pendulum_rt_bundle, model="onnx-fp32", on_out_of_range="fp32")
    plain = load_policy(pendulum_rt_bundle, model="onnx-fp32")
    np.testing.assert_array_equal(policy.act_batch(obs), plain.act_batch(obs))
    assert policy.info.fp32_model == "onnx-fp32" and policy.stats.fp32_steps == 32
