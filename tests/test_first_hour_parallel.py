"""`--workers N` / `--no-ray`: where independent jobs run (quarl_edge/parallel.py), and third-party notices
kept off our stderr at their source (issue 29 scope 7, issue 28 scope 8)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_error

from quarl_edge.parallel import Workers, pool
from quarl_edge.runtimes.errors import InputError

# what a third party prints on our stderr: absl/glog lines, Python warnings, TF/LiteRT INFO, Ray's notes
THIRD_PARTY = re.compile(
    r"^[IWEF]\d{4} |^(INFO|WARNING|ERROR):|Warning: |warnings\.warn|site-packages/|Token authentication"
    r"|os\.fork\(\)|XNNPACK|TensorFlow|absl|^\s+\w+ = _?fork_exec|Ray"
)
has_ray = importlib.util.find_spec("ray") is not None


def third_party_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if THIRD_PARTY.search(line)]


def _square_plus(offset: int, x: int) -> tuple[int, int]:
    return x * x + offset, os.getpid()


def test_one_worker_is_this_process_and_more_are_other_processes() -> None:
    assert Workers().backend == "in-process"
    assert Workers(3, ray=False).backend == "processes"
    assert Workers(3).backend == ("ray" if has_ray else "processes")
    assert Workers(1, address="ray://head:10001").backend == "ray"
    with pool(Workers()) as p:
        assert p.map(_square_plus, [(1,), (2,)], (10,)) == [(11, os.getpid()), (14, os.getpid())]
        job = p.submit(_square_plus, 0, 3)
        assert job.result() == (9, os.getpid())
    with pool(Workers(2, ray=False)) as p:
        out = p.map(_square_plus, [(x,) for x in range(6)], (1,))
        assert p.submit(_square_plus, 0, 4).result()[0] == 16
    assert [v for v, _ in out] == [x * x + 1 for x in range(6)]
    assert os.getpid() not in {pid for _, pid in out}  # spawned workers, not this process
    for bad, match in (({"count": 0}, "--workers 0"), ({"count": True}, "--workers True"),
                       ({"count": 2, "ray": False, "address": "auto"}, "--no-ray")):  # fmt: skip
        with pytest.raises(InputError, match=match):
            Workers(**bad)  # type: ignore[arg-type]


def test_tune_refuses_contradicting_worker_flags_before_loading_anything(tmp_path: Path, cli: Any) -> None:
    r = cli("tune", "--policy", "p", "--out", tmp_path / "t", "--no-ray", "--address", "auto")
    assert "--address names a Ray cluster and --no-ray says not to use Ray" in assert_one_error(r)
    r = cli("tune", "--policy", "p", "--out", tmp_path / "t", "--workers", "0")
    assert "--workers 0 is not a whole number in [1, 256]" in assert_one_error(r)
    help_text = cli("tune", "--help")
    assert help_text.returncode == 0 and not third_party_lines(help_text.stderr)


NOISY = """
import sys
import jax
jax.devices()  # JAX's backends up: its at-fork handler is installed, as after a TFLite export
from quarl_edge.parallel import Workers, pool
from quarl_edge.runtimes.fsutil import sha256_bytes
with pool(Workers(2, ray={ray})) as p:
    print([h[:8] for h in p.map(sha256_bytes, [(b"a",), (b"b",)])])
"""


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="JAX comes with litert-torch (tflite extra)"
)
@pytest.mark.parametrize("ray", [None, False], ids=["ray", "processes"])
def test_starting_workers_prints_no_third_party_notice(ray: bool | None) -> None:
    """Workers started after JAX has loaded (what a TFLite export does): Ray's token-authentication note
    and JAX's os.fork warning stay off stderr; the same start without quarl_edge.parallel shows them (so
    this test can fail)."""
    if ray is None and not has_ray:
        pytest.skip("Ray is not installed")
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    r = subprocess.run([sys.executable, "-c", NOISY.format(ray=ray)], capture_output=True, text=True,
                       timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "['ca978112', '3e23e816']"
    assert third_party_lines(r.stderr) == [], r.stderr
    if ray is None:  # the bare ray.init of the same process prints both
        bare = (
            NOISY.split("from quarl_edge")[0]
            + "import ray\nray.init(include_dashboard=False)\nray.shutdown()\n"
        )
        r = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=300, env=env)
        # JAX's fork warning always; Ray's token note only where Ray has not made its token yet (it
        # varies with the machine's ~/.ray state), so it is not what makes this control fail or pass
        assert any("os.fork()" in x for x in third_party_lines(r.stderr)), r.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("litert_torch") is None, reason="the tflite extra")
def test_export_to_tflite_prints_only_our_lines(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    """litert-torch loads TensorFlow's and JAX's C++ runtimes and torchao: none of their INFO/W lines or
    Python warnings reach the user (exporters/tflite.py keeps the converter's output to itself), only ours
    do. Python's default warning filters, as a user's shell has them (the cli fixture ignores warnings)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    r = subprocess.run([sys.executable, "-m", "quarl_edge.cli", "export", "--policy", str(cartpole_policy),
                        "--calibration", str(cartpole_calib), "--to", "tflite-int8,onnx-int8", "--out", "b"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert third_party_lines(r.stderr) == [], r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("next: quarl-edge bench --bundle b")
