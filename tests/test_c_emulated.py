"""C policies on the emulated Raspberry Pi 4 (issue 31 acceptance; marker ``emulated``, root, minutes).

The board's rootfs ships the C toolchain a Raspberry Pi OS image has (gcc, g++, make, cmake:
devices/rootfs.py's recipe), so everything here is built on the board by its own compilers, under qemu:

- ``bench`` of a CartPole bundle with c-int8, compiled there by the board's gcc (the ``c`` runtime finds
  ``cc``; flags from the board's CPU features: no dot product on the Cortex-A72), closed-loop episodes on
  the same seeds as ONNX;
- the `deploy --emit c` folder copied there, built by cmake + make + gcc/g++, and its C and C++ loops run
  for 1,000 steps on the trace: the same actions as the Python runtime on the host.

The board is the session's (``emu_board``, tests/conftest.py: one `up` per run, shared by every emulated
test); what this file puts on it is removed afterwards. ``pytest -s`` prints the figures (emulated: qemu's
speed, not a Pi's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import EmuSession, emu_scp, emu_ssh

from quarl_edge.devices import emulate
from quarl_edge.emit_c import emit_c
from quarl_edge.runtimes.fsutil import sha256_file

pytestmark = [pytest.mark.emulated, pytest.mark.timeout(1800)]
REMOTE_EMIT = "qe-c-emit"
BOARD_LEFTOVERS = f"{REMOTE_EMIT} .cache/quarl-edge/c"  # and the benched bundle, by its hash


@pytest.fixture(scope="module", autouse=True)
def _clean_board(emu_session: EmuSession) -> Iterator[None]:
    """The board as the other emulated tests expect it: without this file's builds and bundles."""
    yield
    r = emu_ssh(emu_session.status, f"rm -rf {BOARD_LEFTOVERS}")
    assert r.returncode == 0, r.stderr[-1000:]


def _toolchain(board: emulate.Status) -> str:
    r = emu_ssh(board, "cc --version | head -1; g++ --version | head -1; cmake --version | head -1")
    assert r.returncode == 0, "the board's rootfs has no C toolchain: " + r.stderr[-1000:]
    return "; ".join(r.stdout.splitlines())


def test_bench_c_int8_compiled_on_the_board_with_closed_loop_episodes(
    emu_board: emulate.Status, c_bundle: Callable[[str], Path]
) -> None:
    from quarl_edge.bench.fleet import bench_on_device
    from quarl_edge.bench.run import BenchConfig

    bundle = c_bundle("cartpole-ppo")
    assert emu_ssh(emu_board, "rm -rf .cache/quarl-edge/c").returncode == 0  # compiled now, not reused
    t0 = time.monotonic()
    cfg = BenchConfig(episodes=3, max_steps=200, latency_samples=200, warmup=10)
    try:
        report = bench_on_device(bundle, cfg, device="rpi4-emu").to_dict()
    finally:
        emu_ssh(emu_board, f"rm -rf .cache/quarl-edge/bundles/{sha256_file(bundle / 'manifest.json')}")
    took = time.monotonic() - t0
    device = report["device"]
    assert device["machine"] == "aarch64" and device["emulated"] is True
    assert str(device.get("c_compiler", "")).startswith("gcc-"), device.get("c_compiler")
    assert not (device.get("cpu_features") or {}).get("asimddp")  # the Cortex-A72: -march=armv8-a
    models = {m["name"]: m for m in report["models"]}
    c8, o8 = models["c-int8"], models["onnx-int8"]
    assert c8["runtime"].startswith("c gcc-") and models["c-fp32"]["runtime"].startswith("c gcc-")
    # built there, once per model: the bundle ships no object (no --c-prebuilt)
    built = emu_ssh(emu_board, "ls .cache/quarl-edge/c/*/policy.so | wc -l")
    assert built.stdout.strip() == "2", built.stdout + built.stderr
    assert c8["reward"]["episodes"] == 3 and None not in c8["reward"]["per_episode"]
    # the same int8 arithmetic on the board: the same episodes as ONNX Runtime's int8, seed for seed
    assert c8["reward"]["per_episode"] == o8["reward"]["per_episode"]
    assert c8["agreement"] == o8["agreement"]
    rows = {
        n: (round(m["latency"]["p50_us"], 1), m["reward"]["mean"], m["runtime"]) for n, m in models.items()
    }
    print(f"\n[emulated rpi4] toolchain: {_toolchain(emu_board)}")
    print(f"[emulated rpi4] bench in {took:.0f} s (both gcc compiles included); "
          f"p50 us (emulated), mean return, runtime: {rows}")  # fmt: skip


@pytest.mark.parametrize("name", ["cartpole-ppo", "pendulum-sac"])
def test_emitted_folder_builds_with_cmake_on_the_board_and_acts_as_python(
    emu_board: emulate.Status, c_bundle: Callable[[str], Path], name: str, tmp_path: Path
) -> None:
    out = tmp_path / "emit"
    emit_c(c_bundle(name), out)
    assert emu_ssh(emu_board, f"rm -rf {REMOTE_EMIT} && mkdir -p {REMOTE_EMIT}").returncode == 0
    emu_scp(emu_board, [out], f"{REMOTE_EMIT}/")
    d = f"{REMOTE_EMIT}/emit"
    t0 = time.monotonic()
    build = emu_ssh(emu_board, f"cmake -S {d} -B {d}/build 2>&1 && cmake --build {d}/build -j 2 2>&1",
                    timeout=1200)  # fmt: skip
    built = time.monotonic() - t0
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    assert "no C++ compiler" not in build.stdout, build.stdout[-2000:]  # g++ is there: both loops
    expected = (out / "actions.txt").read_text().splitlines()
    for exe in ("loop_c", "loop_cpp"):
        r = emu_ssh(emu_board, f"{d}/build/{exe} --obs {d}/observations.f32 --steps 1000 --hz 0")
        assert r.returncode == 0, (exe, r.stderr[-1000:])
        got = r.stdout.splitlines()
        assert len(got) == 1000, exe
        if name.startswith("cartpole"):
            assert got == expected, exe
        else:  # the same C, aarch64 vs x86-64 float rounding (FMA contraction) at most
            diff = np.abs(np.array(got, float) - np.array(expected, float)).max()
            assert diff <= 1e-5, (exe, diff)
    speed = {exe: emu_ssh(emu_board, f"{d}/build/{exe} --steps 5000 --hz 0 --quiet --obs {d}/observations.f32")
             .stderr.strip() for exe in ("loop_c", "loop_cpp")}  # fmt: skip
    paced = emu_ssh(emu_board, f"{d}/build/loop_c --steps 200 --hz 100 --quiet").stderr.strip()
    print(f"\n[emulated rpi4] {name}: cmake configure + build (C and C++ loops) {built:.0f} s; "
          f"pure loops (emulated): {speed}; C loop at 100 Hz: {paced}")  # fmt: skip
