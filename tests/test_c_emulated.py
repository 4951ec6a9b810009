"""C policies on the emulated Raspberry Pi 4 (issue 31 acceptance; marker ``emulated``, root, minutes).

The board's rootfs has no C compiler or cmake, and this test leaves it as built: `devices setup`'s path
(aarch64 wheels downloaded on the host, pip offline on the board) builds a second venv in the login
directory with the runtimes plus ``ziglang`` (a whole C toolchain from pip), ``cmake`` and ``ninja``; removed
afterwards. Then, on the board:

- ``bench`` of a CartPole bundle with c-int8 (compiled there by zig for aarch64, flags from the board's
  CPU features: no dot product on the Cortex-A72), closed-loop episodes on the same seeds as ONNX;
- the `deploy --emit c` folder copied there, built by cmake (zig as CC) and its C loop run for 1,000
  steps on the trace: the same actions as the Python runtime on the host (the C++ loop: on the host only,
  zig would build libc++ from source under qemu first).

A board already running (someone else's `up`) is used and left running; otherwise this file starts it
and stops it. ``pytest -s`` prints the figures (marked emulated: qemu's speed, not a Pi's).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.devices import emulate, wheelhouse
from quarl_edge.emit_c import emit_c
from quarl_edge.runtimes.fsutil import sha256_file

pytestmark = [pytest.mark.emulated, pytest.mark.timeout(3600)]
VENV = ".local/share/quarl-edge/venv-c"
REMOTE_EMIT = "qe-c-emit"


def _ssh(st: emulate.Status, command: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-i", str(st.identity), "-o", f"UserKnownHostsFile={st.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-p", str(st.port), f"root@{st.address}", command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _scp(st: emulate.Status, local: Path, remote: str) -> None:
    argv = ["scp", "-q", "-r", "-i", str(st.identity), "-o", f"UserKnownHostsFile={st.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-P", str(st.port), str(local),
            f"root@{st.address}:{remote}"]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def board() -> Iterator[emulate.Status]:
    if os.geteuid() != 0:
        pytest.skip("needs root (the emulated board)")
    before = emulate.status("rpi4")
    if not before.running:
        emulate.up("rpi4", log=print)
    try:
        yield emulate.status("rpi4")
    finally:
        if not before.running and emulate.status("rpi4").running:
            emulate.down("rpi4", log=print)


@pytest.fixture(scope="module")
def toolchain(board: emulate.Status) -> Iterator[str]:
    """A venv in the board's login directory with the runtimes, ziglang, cmake and ninja; its python."""
    from quarl_edge.devices import setup

    spec, pins = wheelhouse.platform_pinned(
        wheelhouse.WheelhouseSpec(packages=wheelhouse.RUNTIME_PACKAGES + ("ziglang", "cmake", "ninja"))
    )
    t0 = time.monotonic()
    try:
        python = f"{VENV}/bin/python"  # an earlier run's venv, when it was not removed
        if _ssh(board, f"test -x {VENV}/bin/ninja && {python} -c 'import ziglang, numpy'").returncode != 0:
            with setup.open_device("rpi4-emu") as (shell, _):
                python = setup.setup(
                    shell, wheelhouse.download(spec, pins=pins), venv=VENV, packages=spec.packages
                )
        print(f"\n[emulated rpi4] venv with ziglang, cmake and ninja: {time.monotonic() - t0:.0f} s")
        yield python
    finally:
        assert (
            _ssh(
                board, f"rm -rf {VENV} {REMOTE_EMIT} .cache/quarl-edge/c .cache/quarl-edge/wheels .cache/zig"
            ).returncode
            == 0
        )


def test_bench_c_int8_compiled_on_the_board_with_closed_loop_episodes(
    board: emulate.Status, toolchain: str, c_bundle: Callable[[str], Path]
) -> None:
    from quarl_edge.bench.fleet import bench_on_device
    from quarl_edge.bench.run import BenchConfig

    bundle = c_bundle("cartpole-ppo")
    t0 = time.monotonic()
    try:
        cfg = BenchConfig(episodes=3, max_steps=200, latency_samples=200, warmup=10)
        report = bench_on_device(bundle, cfg, device="rpi4-emu", overrides={"python": toolchain}).to_dict()
    finally:
        _ssh(board, f"rm -rf .cache/quarl-edge/bundles/{sha256_file(bundle / 'manifest.json')}")
    took = time.monotonic() - t0
    device = report["device"]
    assert device["machine"] == "aarch64" and device["emulated"] is True
    assert str(device.get("c_compiler", "")).startswith("zig-"), device.get("c_compiler")
    models = {m["name"]: m for m in report["models"]}
    c8, o8 = models["c-int8"], models["onnx-int8"]
    assert c8["runtime"].startswith("c zig-"), c8["runtime"]
    assert c8["reward"]["episodes"] == 3 and None not in c8["reward"]["per_episode"]
    # the same int8 arithmetic on the board: the same episodes as ONNX Runtime's int8, seed for seed
    assert c8["reward"]["per_episode"] == o8["reward"]["per_episode"]
    assert c8["agreement"] == o8["agreement"]
    rows = {n: (round(m["latency"]["p50_us"], 1), m["reward"]["mean"]) for n, m in models.items()}
    print(
        f"[emulated rpi4] bench in {took:.0f} s (compiles included); p50 us (emulated), mean return: {rows}"
    )


@pytest.mark.parametrize("name", ["cartpole-ppo", "pendulum-sac"])
def test_emitted_folder_builds_with_cmake_on_the_board_and_acts_as_python(
    board: emulate.Status, toolchain: str, c_bundle: Callable[[str], Path], name: str, tmp_path: Path
) -> None:
    out = tmp_path / "emit"
    emit_c(c_bundle(name), out)
    assert _ssh(board, f"rm -rf {REMOTE_EMIT} && mkdir -p {REMOTE_EMIT}").returncode == 0
    _scp(board, out, f"{REMOTE_EMIT}/")
    venv_bin = "$HOME/" + shlex.quote(str(Path(toolchain).parent))  # cmake's try_compile runs elsewhere
    zig = f'$({venv_bin}/python -c "import ziglang, os; print(os.path.dirname(ziglang.__file__))")/zig'
    d = f"{REMOTE_EMIT}/emit"
    t0 = time.monotonic()
    # the C example only: zig's C++ needs libc++ built from source first, half an hour under qemu (the
    # C++ example builds and runs on the host: tests/test_c_emit.py)
    build = _ssh(board, f'set -o pipefail; export CC="{zig} cc"; {venv_bin}/cmake -G Ninja '
                        f"-DCMAKE_MAKE_PROGRAM={venv_bin}/ninja -S {d} -B {d}/build 2>&1 | tail -20 "
                        f"&& {venv_bin}/cmake --build {d}/build 2>&1 | tail -20")  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    built = time.monotonic() - t0
    expected = (out / "actions.txt").read_text().splitlines()
    for exe in ("loop_c",):
        r = _ssh(board, f"{d}/build/{exe} --obs {d}/observations.f32 --steps 1000 --hz 0")
        assert r.returncode == 0, r.stderr[-1000:]
        got = r.stdout.splitlines()
        assert len(got) == 1000
        if name.startswith("cartpole"):
            assert got == expected, exe
        else:  # the same C, aarch64 vs x86-64 float rounding (FMA contraction) at most
            diff = np.abs(np.array(got, float) - np.array(expected, float)).max()
            assert diff <= 1e-5, (exe, diff)
    speed = _ssh(
        board, f"{d}/build/loop_c --steps 20000 --hz 0 --quiet --obs {d}/observations.f32"
    ).stderr.strip()
    paced = _ssh(board, f"{d}/build/loop_c --steps 200 --hz 100 --quiet").stderr.strip()
    print(
        f"\n[emulated rpi4] {name}: cmake build {built:.0f} s; pure C loop (emulated): {speed}; at 100 Hz: {paced}"
    )
    print(json.dumps({"name": name, "build_s": round(built, 1)}))
