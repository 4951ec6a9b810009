"""`deploy --emit c DIR` (issue 31 scope 3): the folder builds with cmake, and its C and C++ loops give,
on the bundle's 1,000 recorded observations, the Python runtime's actions; the fixed-rate loop counts
overruns; a second emit replaces only an emit; a bundle without a C model is one error line."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_absent

from quarl_edge.emit_c import emit_c
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.trace import load_trace

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("cc") is None,
                                reason="needs cmake and a C compiler")  # fmt: skip


def build(folder: Path) -> Path:
    b = folder / "build"
    subprocess.run(["cmake", "-S", str(folder), "-B", str(b)], check=True, capture_output=True, timeout=300)
    subprocess.run(["cmake", "--build", str(b)], check=True, capture_output=True, timeout=300)
    return b


def run(exe: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.parametrize("name", ["cartpole-ppo", "pendulum-sac"])
def test_emitted_loops_build_and_act_as_the_python_runtime(
    name: str, c_bundle: Callable[[str], Path], tmp_path: Path
) -> None:
    bundle = c_bundle(name)
    out = tmp_path / "emit"
    e = emit_c(bundle, out)
    assert e.model == "c-int8" and e.observations == 1000
    b = build(out)
    policy = load_policy(bundle, model="c-int8", threads=1)
    ref = policy.act_batch(load_trace(bundle / "trace.npz").obs)
    for exe in ("loop_c", "loop_cpp"):
        p = run(b / exe, "--obs", str(out / "observations.f32"), "--steps", "1000", "--hz", "0")
        lines = p.stdout.splitlines()
        assert len(lines) == 1000
        got = np.array([[float(v) for v in line.split()] for line in lines])
        if policy.spec.action_space.is_discrete:
            assert np.array_equal(got[:, 0].astype(int), ref), exe
        else:  # the same C, built with other flags (cmake's, not the runtime's): float rounding at most
            assert float(np.abs(got - ref).max()) <= 1e-5, exe
        assert p.stdout == (out / "actions.txt").read_text() or not policy.spec.action_space.is_discrete
        assert "steps 1000, overruns" in p.stderr


def test_fixed_rate_loop_paces_and_counts_overruns(c_bundle: Callable[[str], Path], tmp_path: Path) -> None:
    out = tmp_path / "emit"
    emit_c(c_bundle("cartpole-ppo"), out)
    b = build(out)
    import time

    t0 = time.monotonic()
    p = run(b / "loop_c", "--hz", "200", "--steps", "100", "--quiet")
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.45  # 100 periods of 5 ms, paced by absolute deadlines
    assert p.stdout == "" and "steps 100, overruns" in p.stderr and "period 5000000 ns" in p.stderr
    p = run(b / "loop_c", "--steps", "3", "--hz", "0", "--fifo", "10", "--quiet")  # granted or said so
    assert "steps 3" in p.stderr


def test_emit_replaces_only_an_emit_and_refuses_a_bundle_without_c(
    c_bundle: Callable[[str], Path], cartpole_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "emit"
    emit_c(c_bundle("cartpole-ppo"), out)
    emit_c(c_bundle("pendulum-sac"), out)  # an earlier emit is replaced
    assert "pendulum-sac" in (out / "README.md").read_text()
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    with pytest.raises(InputError):
        emit_c(c_bundle("cartpole-ppo"), other)
    assert (other / "mine.txt").read_text() == "x"
    with pytest.raises(InputError, match="has no C model") as e:
        emit_c(cartpole_bundle, tmp_path / "none")
    assert "--to c-int8" in str(e.value)
    assert_absent(tmp_path / "none")


def test_cli_deploy_emit_c(cli: Callable[..., subprocess.CompletedProcess[str]], c_bundle: Callable[[str], Path],
                           tmp_path: Path) -> None:  # fmt: skip
    from conftest import assert_one_error

    bundle = c_bundle("cartpole-ppo")
    p = cli("deploy", "--bundle", bundle, "--emit", "c", tmp_path / "out")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "CMakeLists.txt").is_file() and "cmake -S" in p.stderr
    line = assert_one_error(
        cli("deploy", "--bundle", bundle, "--emit", "c", tmp_path / "o2", "--device", "rpi4")
    )
    assert "takes no --device" in line
    assert_absent(tmp_path / "o2")
