"""C export (issue 31): every zoo MLP policy as C99, checked against the ONNX models it was generated from.

For each policy one bundle holds onnx-fp32, onnx-int8, c-fp32 and c-int8 (exported once per session).
Through the runtime API (load_policy -> the ``c`` adapter -> a shared object compiled here), on the
recorded trace: C fp32 vs ONNX fp32 within 1e-5 (discrete: the same action everywhere), C int8 vs ONNX
int8 the same discrete action everywhere, continuous actions within one output quantization step (the
largest change one step of the last int8 tensor makes in an action); closed-loop returns on paired
seeds equal; and one weight changed in the generated C file is caught by the same comparison. CartPole
PPO and Pendulum SAC run in the fast tier, the other zoo MLPs under ``slow``. ``pytest -s`` prints the
figures per policy.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import C_TARGETS as TARGETS
from conftest import CALIB, POLICIES, assert_absent, assert_discriminating, assert_one_error

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.c import header_path
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.cprogram import Program
from quarl_edge.runtimes.csource import read_source, render_c
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace
from quarl_edge.zoo import load_zoo

FP32_TOL = 1e-5
FAST = ("cartpole-ppo", "pendulum-sac")
SEEDS = (0, 1, 2)
STEPS = 200


def zoo_mlps() -> list[str]:
    return [e.name for e in load_zoo() if e.model == "mlp"]


@dataclass(frozen=True)
class Comparison:
    fp32_max_diff: float
    fp32_agreement: float
    int8_max_diff: float
    int8_agreement: float
    int8_step: float
    """one output quantization step: the tolerance for continuous int8 actions"""
    differing: int
    """int8 action values more than FP32_TOL apart (an int8 rounding step, not float rounding)"""

    @property
    def ok(self) -> bool:
        fp32 = self.fp32_agreement == 1.0 and self.fp32_max_diff <= FP32_TOL
        return fp32 and self.int8_agreement == 1.0 and self.int8_max_diff <= self.int8_step


def output_step(program: Program, action_half_range: np.ndarray | None) -> float:
    """The most one quantization step of the last int8 tensor can move an action component: its scale
    times the largest weight any later float layer gives one of its values (times the tanh-unscale
    factor; tanh' <= 1). Continuous C int8 actions must agree with ONNX int8 within it."""
    last = max((i for i, o in enumerate(program.ops) if o.op in ("quantize", "dense_i8")), default=None)
    if last is None:
        return 0.0
    op = program.ops[last]
    later = [o for o in program.ops[last + 1 :] if o.op == "dense_f32"]
    scale = next((o.scale for o in program.ops[last + 1 :] if o.op == "dequantize"), None) or 0.0
    gain = float(np.abs(program.arrays[str(later[0].w)]).max()) if later else 1.0
    if op.op == "dense_i8" and program.buffers[op.y].kind == "f32":
        return 0.0  # the int8 layer's output is float: no step after it
    half = float(np.max(action_half_range)) if action_half_range is not None else 1.0
    return float(np.float32(scale) * gain * half) + FP32_TOL


def compare(bundle: Path) -> Comparison:
    """C vs ONNX through load_policy on the bundle's trace (the same comparison for a mutated bundle)."""
    trace = load_trace(bundle / "trace.npz")
    acts = {m: load_policy(bundle, model=m, threads=1).act_batch(trace.obs) for m in TARGETS}
    program = read_source((bundle / "policy.int8.c").read_text(), "c-int8")
    spec = load_policy(bundle, model="c-int8", threads=1).spec.action_space
    half = None
    if not spec.is_discrete:
        from quarl_edge.runtimes.envs import bounds

        lo, hi = bounds(spec)
        half = (np.asarray(hi) - np.asarray(lo)) / 2

    def diff(a: str, b: str) -> tuple[float, float, int]:
        x, y = acts[a].astype(np.float64), acts[b].astype(np.float64)
        d = np.abs(x - y)
        agree = float(np.mean(x == y)) if spec.is_discrete else 1.0
        return float(d.max()) if not spec.is_discrete else 0.0, agree, int((d > FP32_TOL).sum())

    fd, fa, _ = diff("c-fp32", "onnx-fp32")
    idf, ia, n = diff("c-int8", "onnx-int8")
    return Comparison(fd, fa, idf, ia, output_step(program, half), n)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in zoo_mlps()]
)
def test_c_matches_onnx_on_the_trace(name: str, c_bundle: Callable[[str], Path]) -> None:
    bundle = c_bundle(name)
    c = compare(bundle)
    print(f"\n{name}: c-fp32 vs onnx-fp32 max |d| {c.fp32_max_diff:.2e} agree {c.fp32_agreement:.3f}; "
          f"c-int8 vs onnx-int8 max |d| {c.int8_max_diff:.2e} (step {c.int8_step:.2e}) agree "
          f"{c.int8_agreement:.3f}, {c.differing} values more than 1e-5 apart")  # fmt: skip
    assert c.ok, c
    ref = load_policy(bundle, model="onnx-fp32", threads=1).act_batch(load_trace(bundle / "trace.npz").obs)
    if ref.ndim == 1:  # an agreement of 1.0 means something only when the policy's actions vary
        assert_discriminating(ref, int(ref.max()) + 1, min_distinct=2, max_share=0.95)
    else:
        assert float(np.ptp(ref)) > 0.1


def perturbed_returns(
    bundle: Path, model: str, seeds: tuple[int, ...], steps: int, delta: float
) -> np.ndarray:
    """Returns of ``model`` with ``delta`` added to every action component: what a difference of that
    size alone does to a return in this environment (the dynamics amplify it: MuJoCo's HalfCheetah turns
    1e-5 into another episode within 50 steps)."""
    policy = load_policy(bundle, model=model, threads=1)
    env = policy.make_env()
    out = []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            policy.reset()
            ret = 0.0
            for _ in range(steps):
                obs, reward, terminated, truncated, _ = env.step(
                    np.asarray(policy.act(obs), np.float32) + np.float32(delta)
                )
                ret += float(reward)
                if terminated or truncated:
                    break
            out.append(ret)
    finally:
        env.close()
    return np.array(out)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in zoo_mlps()]
)
def test_closed_loop_returns_equal_on_paired_seeds(name: str, c_bundle: Callable[[str], Path]) -> None:
    """Discrete actions: the same actions, so the same episodes, seed for seed. Continuous: C and ONNX
    actions differ by float rounding (fp32: within 1e-5; int8: within one output step), so their
    returns agree within what a difference of that size does in that environment, measured here on the
    ONNX model itself (its actions shifted by that much): thousandths on Pendulum, whole episodes on
    HalfCheetah (there the trace comparison above is the check)."""
    bundle = c_bundle(name)
    if name.startswith(("lunarlander", "halfcheetah", "walker", "cartpole-balance")):
        pytest.importorskip({"l": "Box2D", "h": "mujoco", "w": "dm_control", "c": "dm_control"}[name[0]])
    returns = {}
    for model in TARGETS:
        runs = PolicyRunner(bundle, model).episodes(list(SEEDS), max_steps=STEPS)
        assert all(r.error is None for r in runs), runs
        returns[model] = np.array([r.ret for r in runs])
    if load_policy(bundle, model="c-int8", threads=1).spec.action_space.is_discrete:
        print(f"\n{name}: returns { ({k: np.round(v, 3).tolist() for k, v in returns.items()}) }")
        assert np.array_equal(returns["c-fp32"], returns["onnx-fp32"])
        assert np.array_equal(returns["c-int8"], returns["onnx-int8"])
        return
    figures = []
    for c_model, ref, delta in (
        ("c-fp32", "onnx-fp32", FP32_TOL),
        ("c-int8", "onnx-int8", compare(bundle).int8_step),
    ):
        d = float(np.abs(returns[c_model] - returns[ref]).max())
        shifted = (
            [perturbed_returns(bundle, ref, SEEDS, STEPS, sign * delta) for sign in (1, -1)] if delta else []
        )
        floor = max((float(np.abs(r - returns[ref]).max()) for r in shifted), default=0.0)
        figures.append(f"|{c_model} - {ref}| {d:.4f} (floor {floor:.4f})")
        assert d <= 3 * floor + 0.05, (c_model, d, floor)
    print(
        f"\n{name}: returns { ({k: np.round(v, 3).tolist() for k, v in returns.items()}) }; {'; '.join(figures)}"
    )


def _rehash(bundle: Path, file: str) -> None:
    m = json.loads((bundle / "manifest.json").read_text())
    for e in m["models"]:
        if e["file"] == file:
            e["sha256"], e["size_bytes"] = sha256_file(bundle / file), (bundle / file).stat().st_size
    (bundle / "manifest.json").write_text(json.dumps(m, indent=2))


@pytest.mark.parametrize("name", FAST)
def test_one_weight_changed_in_the_c_file_is_caught(
    name: str, c_bundle: Callable[[str], Path], tmp_path: Path
) -> None:
    """The generated C with one int8 weight changed (rendered as the generator would, so the runtime
    compiles it) fails the comparison above."""
    bundle = tmp_path / name
    shutil.copytree(c_bundle(name), bundle)
    c_file = bundle / "policy.int8.c"
    program = read_source(c_file.read_text(), "c")
    layer = next(o for o in program.ops if o.op == "dense_i8")
    w = program.arrays[str(layer.w)].copy()
    j, i = np.unravel_index(int(np.argmax(np.abs(w))), w.shape)
    w[j, i] = -w[j, i]  # the largest weight, sign flipped
    mutated = Program(**{**program.__dict__, "arrays": {**program.arrays, str(layer.w): w}})
    c_file.write_text(render_c(mutated))
    _rehash(bundle, "policy.int8.c")
    c = compare(bundle)
    print(
        f"\n{name} mutated: c-int8 vs onnx-int8 agree {c.int8_agreement:.3f}, max |d| {c.int8_max_diff:.3f}"
    )
    assert not c.ok


def test_edited_c_is_refused_before_compiling(c_bundle: Callable[[str], Path], tmp_path: Path) -> None:
    """A C file that is not what the generator writes (here: code added to it, hashes updated) is not
    compiled: one InputError line."""
    bundle = tmp_path / "b"
    shutil.copytree(c_bundle("cartpole-ppo"), bundle)
    c_file = bundle / "policy.int8.c"
    text = c_file.read_text()
    evil = text.replace(
        "void qe_policy_reset(void)\n{\n}", 'void qe_policy_reset(void)\n{\n    system("touch pwned");\n}'
    )
    assert evil != text
    c_file.write_text(evil)
    _rehash(bundle, "policy.int8.c")
    with pytest.raises(InputError) as e:
        load_policy(bundle, model="c-int8", threads=1)
    assert "not what quarl-edge's C generator writes" in str(e.value)
    assert "\n" not in str(e.value)
    # a number written another way than the generator writes it is refused too
    c_file.write_text(re.sub(r"-?0\.\d+f", "0.5f", text, count=1).replace("0.5f", "5e-1f", 1))
    _rehash(bundle, "policy.int8.c")
    with pytest.raises(InputError):
        load_policy(bundle, model="c-int8", threads=1)


def test_header_names_sizes_and_api(c_bundle: Callable[[str], Path]) -> None:
    for name, discrete in (("cartpole-ppo", True), ("pendulum-sac", False)):
        bundle = c_bundle(name)
        h = header_path(bundle / "policy.int8.c").read_text()
        assert '#define QE_POLICY_NAME "' + name + '"' in h
        assert "#define QE_POLICY_OBS_SIZE " + ("4" if discrete else "3") in h
        assert ("int qe_policy_act(const float *obs);" if discrete else
                "void qe_policy_act(const float *obs, float *action);") in h  # fmt: skip
        assert "void qe_policy_reset(void);" in h
        c = (bundle / "policy.int8.c").read_text()
        assert "malloc" not in c and "#include <stdlib.h>" not in c
        assert re.findall(r"#include <(\w+\.h)>", c) == ["math.h", "stddef.h", "stdint.h"]


def test_cnn_is_refused_naming_the_op(tmp_path: Path) -> None:
    out = tmp_path / "pong"
    with pytest.raises(InputError) as e:
        export_bundle(load_checkpoint(POLICIES / "pong-dqn"),
                      BundleRequest(out=out, targets=("c-int8",), calibration=CALIB / "pong-dqn.npz"))  # fmt: skip
    msg = str(e.value)
    assert "Conv" in msg and "onnx-int8" in msg and "tflite-int8" in msg and "\n" not in msg
    assert_absent(out)


def test_cli_cnn_is_one_error_line(cli: Callable[..., object], tmp_path: Path) -> None:
    p = cli("export", "--policy", POLICIES / "pong-dqn", "--to", "c-fp32",
            "--calibration", CALIB / "pong-dqn.npz", "--out", tmp_path / "b")  # fmt: skip
    line = assert_one_error(p)  # type: ignore[arg-type]
    assert "Conv" in line and "onnx-fp32" in line
    assert_absent(tmp_path / "b")
