"""The emulated Raspberry Pi 4, end to end (marker ``emulated``; root; the board is the session's
``emu_board`` from conftest: one `quarl-edge devices emulate rpi4 up` per run, a fresh build ~7 min, a
cached start seconds).

Plain OpenSSH into the arm64 board, the device runner and an onnx-int8 CartPole closed loop on aarch64
onnxruntime, `quarl-edge bench --device rpi4-emu` of a CartPole bundle with ONNX and TFLite fp32/int8
(episodes on the board, aarch64 onnxruntime and LiteRT), pre-flight refusals, Atari and MuJoCo bundles
benched there after `devices setup` over SSH, deploy and a torch-free script, then `quarl-edge devices emulate
rpi4 down` leaves no process, mount or namespace (and the next `up` reuses the cached build). The unit
tests of the same modules are in tests/test_devices_emulate.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import CALIB, POLICIES, ROOT, EmuSession, _export_shipped, emu_scp, emu_ssh, emulate_cli, qe

from quarl_edge.devices import emulate, hostsys, profiles, wheelhouse
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.trace import load_trace, save_trace


def _since(t0: float) -> float:
    """Seconds since ``t0``, for the figures these tests print (never asserted: this machine is shared)."""
    return time.monotonic() - t0


@pytest.fixture
def board(emu_board: emulate.Status) -> emulate.Status:
    """The session's emulated board (conftest ``emu_board``), under the short name this file uses."""
    return emu_board


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_emulated_board_is_aarch64_over_strict_ssh(board: emulate.Status) -> None:
    assert board.running and board.emulated and board.pid
    p = profiles.load_profile("rpi4-emu")
    assert (p.host, p.port, p.emulated, p.arch) == (board.address, board.port, True, "aarch64")
    assert oct(Path(str(board.identity)).stat().st_mode & 0o777) == "0o600"
    r = emu_ssh(board, "uname -m")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "aarch64"
    # the instruction set a session sees is the Pi 4's Cortex-A72 (ARMv8.0-A), not qemu's `max` CPU:
    # no LSE atomics (HWCAP bit 8), no dot product (bit 20), no SVE (bit 22)
    r = emu_ssh(board, "LD_SHOW_AUXV=1 /bin/true")
    hwcap = int(next(ln.split()[-1] for ln in r.stdout.splitlines() if ln.startswith("AT_HWCAP:")), 16)
    assert hwcap & 0b11 == 0b11 and hwcap & (1 << 8 | 1 << 20 | 1 << 22) == 0, hex(hwcap)


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_emulated_board_refuses_another_host_key(board: emulate.Status, tmp_path: Path) -> None:
    other = tmp_path / "known_hosts"
    other.write_text(
        f"{board.address} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHc6Sx8yq3D4sN3lY2bX0sWn2kP7g3Q1mVwz3kq8c9Zd\n"
    )
    r = subprocess.run(["ssh", "-i", str(board.identity), "-o", f"UserKnownHostsFile={other}", "-o", "StrictHostKeyChecking=yes",
                        "-o", "BatchMode=yes", f"root@{board.address}", "true"], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_emulated_board_runs_onnx_int8_closed_loop(
    board: emulate.Status, cartpole_bundle: Path, tmp_path: Path
) -> None:
    """The device runner on aarch64 onnxruntime: `info`, then an int8 CartPole model for two seeds."""
    pkg = tmp_path / "qe"
    (pkg / "quarl_edge").mkdir(parents=True)
    (pkg / "quarl_edge" / "__init__.py").write_text("")  # the device needs only the runtimes package
    shutil.copytree(
        ROOT / "runtimes", pkg / "quarl_edge" / "runtimes", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(cartpole_bundle, pkg / "bundle")
    assert emu_ssh(board, "rm -rf /root/qe").returncode == 0
    emu_scp(board, [pkg], "/root/")
    py = shlex.quote(str(profiles.load_profile("rpi4-emu").python))

    t0 = time.monotonic()
    r = emu_ssh(board, f"cd /root/qe && {py} -m quarl_edge.runtimes info")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\n[emulated rpi4] runtimes info in {_since(t0):.1f} s: {facts}")
    assert facts["machine"] == "aarch64" and facts["python"].startswith("3.11")
    assert facts["runtimes"]["onnxruntime"] and facts["runtimes"]["numpy"] and facts["runtimes"]["gymnasium"]

    t0 = time.monotonic()
    cmd = f"cd /root/qe && {py} -m quarl_edge.runtimes run --bundle bundle --model onnx-int8 --seeds 1,2 --latency-samples 20"
    r = emu_ssh(board, cmd)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    result = next(e["result"] for e in events if e["event"] == "result")
    shown = {k: result[k] for k in ("runtime", "load_ms", "first_inference_ms", "latency") if k in result}
    print(f"[emulated rpi4] onnx-int8 run in {_since(t0):.1f} s (qemu, not Pi latency): {json.dumps(shown)}")
    episodes = [e for e in events if e["event"] == "episode"]
    assert len(episodes) == 2
    assert all(e["ret"] > 0 and not e.get("error") for e in episodes), episodes
    assert emu_ssh(board, "rm -rf /root/qe").returncode == 0  # keep the cached rootfs as built


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_emulated_bench_runs_onnx_and_tflite_on_the_board(
    board: emulate.Status, cartpole_rt_bundle: Path, tmp_path: Path
) -> None:
    """The user's bench: every model's closed-loop episodes run on the arm64 board (aarch64 onnxruntime and
    LiteRT, from the board's wheelhouse), on the same seeds; int8 drift and agreement come from ARM kernels;
    nothing presents qemu's latency as the board's."""
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    r = qe("bench", "--bundle", cartpole_rt_bundle, "--device", "rpi4-emu", "--episodes", "3", "--duration", "1s",
            "--out", out)  # fmt: skip
    took = _since(t0)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())

    device = report["device"]
    assert device["name"] == "rpi4-emu" and device["emulated"] is True and device["transport"] == "ssh"
    assert device["machine"] == "aarch64" and device["uname"].split()[-1] == "aarch64", device["uname"]
    assert device["cpu_model"].startswith("Cortex-A72")
    # the features qemu's cortex-a72 model presents to the process (getauxval): a Pi 4 has no dot product
    assert device["cpu_features_source"] == "hwcap" and device["cpu_features"]["asimd"] is True
    assert device["cpu_features"]["asimddp"] is False and device["cpu_features"]["i8mm"] is False
    assert device["emulation"] == {
        "emulator": "qemu-user",
        "kernel_arch": os.uname().machine,
        "qemu_cpu": "cortex-a72",
    }
    assert (
        "int8 ISA: asimd; without asimdhp, asimddp, i8mm, bf16 (from hwcap)"
        in out.with_suffix(".md").read_text()
    )
    # a sustained loop on the board: its sensors would be the host's, so none is read or shown as the board's
    for m in report["models"]:
        assert m["sustained"]["calls"] > 0 and m["sustained"]["emulated"] is True, m["name"]
        assert m["sustained"]["not_exposed"] == ["temperature", "clock", "throttling"]
        assert all(r["temp_c"] is None and r["freq_mhz"] is None for r in m["sustained"]["readings"])
    assert "temperature, clock, throttling not exposed (emulated" in out.with_suffix(".md").read_text()
    installed = device["runtimes"]
    assert installed["onnxruntime"] and installed["ai_edge_litert"] and installed["gymnasium"], installed
    # what the board runs is what its wheelhouse pinned (the host's versions where aarch64 wheels exist)
    assert board.runtimes["onnxruntime"] == installed["onnxruntime"]
    assert board.runtimes["ai-edge-litert"] == installed["ai_edge_litert"]

    models = {m["name"]: m for m in report["models"]}
    assert list(models) == ["onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8"]
    seeds = report["settings"]["seeds"]
    assert len(seeds) == 3
    for name, m in models.items():
        assert m["reward"]["seeds"] == seeds and m["reward"]["episodes"] == 3, (name, m["reward"])
        assert m["warnings"] == [], (name, m["warnings"])
        assert m["latency"]["count"] > 0
        runtime = (
            f"onnxruntime {installed['onnxruntime']}"
            if m["format"] == "onnx"
            else f"ai-edge-litert {installed['ai_edge_litert']}"
        )
        assert m["runtime"] == runtime, (name, m["runtime"])  # fmt: skip
    for name in ("onnx-int8", "tflite-int8"):
        drift, agree = models[name]["drift"], models[name]["agreement"]
        assert drift and drift["reward_drop_pct"] is not None and len(drift["rel_ci95"]) == 2, drift
        assert agree and agree["value"] is not None and agree["value"] >= 0.9, agree
    assert models["tflite-fp32"]["drift"]["reward_drop_pct"] is not None

    md = out.with_suffix(".md").read_text()
    device_line = next(ln for ln in md.splitlines() if ln.startswith("Device:"))
    assert "rpi4-emu" in device_line and "emulated" in device_line and "not board latency" in device_line
    assert "aarch64" in device_line
    header = next(ln for ln in md.splitlines() if ln.startswith("| model"))
    assert "p50 us (emulated)" in header and "p99 us (emulated)" in header and "| p50 us |" not in header
    assert f"Runtimes on the device: onnxruntime {installed['onnxruntime']}" in md
    assert f"ai-edge-litert {installed['ai_edge_litert']}: tflite-fp32" in md
    assert "emulated: latency is qemu's" in r.stdout  # the terminal table's title says so too

    print(f"\n[emulated rpi4] bench of 4 models x 3 episodes over SSH: {took:.1f} s (qemu: not Pi latency)")
    for name, m in models.items():
        d, a = m["drift"] or {}, m["agreement"] or {}
        print(f"  {name:<12} p50 {m['latency']['p50_us']:8.1f} us (emulated)  reward {m['reward']['mean']:6.1f}  "
              f"drop {d.get('reward_drop_pct', 0.0) or 0.0:+.2f}%  agree {a.get('value') or '-'}  {m['runtime']}")  # fmt: skip
    print(f"  {next(ln for ln in md.splitlines() if ln.startswith('Runtimes'))}")
    print(f"  harness: {json.dumps({k: v for k, v in report['harness'].items() if k != 'uploaded_files'})}")


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_a_bench_the_board_cannot_run_stops_before_measuring(board: emulate.Status, tmp_path: Path) -> None:
    """Pre-flight: a Pong bundle on a board without ale-py stops at once with the one `devices setup`
    line that fixes it (not the host's pip advice after minutes of latency); a LunarLander bundle, whose
    box2d has no aarch64 wheel, says so and what to do instead. Neither bundle is uploaded. Then the
    LunarLander bundle with --env-on-host plays the same episodes as a local bench."""
    cases = (("pong-dqn", "devices setup rpi4-emu --package ale-py --package opencv-python-headless"),
             ("lunarlander-dqn", "no wheel for aarch64; nothing was measured; run the env on the host"))  # fmt: skip
    for name, words in cases:
        bundle = tmp_path / name
        _export_shipped(bundle, POLICIES / name, CALIB / f"{name}.npz", ("onnx-fp32",))
        r = qe("bench", "--bundle", bundle, "--device", "rpi4-emu", "--episodes", "1", "--json")
        assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
        last = r.stderr.strip().splitlines()[-1]
        assert words in last and "nothing was measured" in last, last
        sha = sha256_file(bundle / "manifest.json")
        assert emu_ssh(board, f"test -e /root/.cache/quarl-edge/bundles/{sha}").returncode == 1
    # what the box2d line says to do: the env here, the policy on the board, the same episodes as here
    bundle = tmp_path / "lunarlander-dqn"
    r = qe("bench", "--bundle", bundle, "--device", "rpi4-emu", "--episodes", "2", "--env-on-host", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    board_run = json.loads(r.stdout)["models"][0]
    r = qe("bench", "--bundle", bundle, "--episodes", "2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert board_run["reward"]["per_episode"] == json.loads(r.stdout)["models"][0]["reward"]["per_episode"]
    _forget(board, [bundle])
    link = board_run["env_on_host"]
    print(
        f"\n[emulated rpi4] LunarLander --env-on-host: {link['steps']} steps, policy p50 "
        f"{link['policy_us']['p50']:.0f} us on the board (emulated), round trip {link['round_trip_us']['p50']:.0f} us"
    )


@pytest.mark.emulated
@pytest.mark.timeout(2400)
def test_atari_and_mujoco_bundles_bench_end_to_end_on_the_board(
    board: emulate.Status, tmp_path: Path
) -> None:
    """`devices setup`'s path and any env on the board: the aarch64 wheelhouse with the bundles' env
    packages uploaded over SSH and a venv built in the login directory (pip offline under qemu; a second
    venv, as on a real board, removed afterwards: the cached rootfs stays as built), then a Pong (Atari,
    frame preprocessing on the board), a HalfCheetah (MuJoCo) and a DM Control bundle bench with
    closed-loop episodes there, paired against fp32."""
    from quarl_edge.bench.fleet import bench_on_device
    from quarl_edge.bench.run import BenchConfig
    from quarl_edge.devices import setup
    from quarl_edge.devices.preflight import bundle_packages

    bundles = {}
    # the board replays a bundle's whole trace per model: Pong's 1,000 frames through the CNN under qemu
    # took ~80 s of this test; 100 frames still calibrate the int8 model and measure its agreement
    pong_calib = save_trace(load_trace(CALIB / "pong-dqn.npz").subsample(100, seed=0), tmp_path / "pong.npz")
    for name, to in (("pong-dqn", "onnx-fp32,onnx-int8"), ("halfcheetah-td3", "onnx-fp32,tflite-int8"),
                     ("cartpole-balance-sac", "onnx-fp32,tflite-int8")):  # fmt: skip
        bundles[name] = tmp_path / name
        calib = pong_calib if name == "pong-dqn" else CALIB / f"{name}.npz"
        _export_shipped(bundles[name], POLICIES / name, calib, tuple(to.split(",")))
    extra = tuple(dict.fromkeys(p for b in bundles.values() for p in bundle_packages(b)))
    assert extra == ("ale-py", "opencv-python-headless", "mujoco", "imageio", "shimmy", "dm-control")
    spec, pins = wheelhouse.platform_pinned(
        wheelhouse.WheelhouseSpec(packages=wheelhouse.RUNTIME_PACKAGES + extra)
    )
    venv = wheelhouse.DEVICE_VENV
    t0 = time.monotonic()
    try:
        with setup.open_device("rpi4-emu") as (shell, profile_venv):
            assert profile_venv == "/opt/quarl-edge/venv"  # the profile's python: the rootfs venv
            python = setup.setup(
                shell, wheelhouse.download(spec, pins=pins), venv=venv, packages=spec.packages
            )
        print(f"\n[emulated rpi4] setup over SSH with {', '.join(extra)} "
              f"(upload + offline pip install under qemu): {_since(t0):.1f} s")  # fmt: skip
        r = emu_ssh(board, f"{python} -c 'import onnxruntime, platform; print(platform.machine())'")
        assert r.returncode == 0 and r.stdout.split() == ["aarch64"], r.stderr
        assert emu_ssh(board, f"test ! -e {wheelhouse.DEVICE_WHEELS}").returncode == 0  # the upload is gone
        for name, bundle in bundles.items():
            t0 = time.monotonic()
            # Pong's frames (ALE, resize and the CNN under qemu) cost ~10x a MuJoCo step: shorter episodes
            steps = 40 if name == "pong-dqn" else 80
            cfg = BenchConfig(episodes=2, max_steps=steps, latency_samples=20, warmup=5)
            report = bench_on_device(
                bundle, cfg, device="rpi4-emu", overrides=profiles.ProfileOverrides(python=python)
            ).to_dict()
            assert report["device"]["machine"] == "aarch64" and report["device"]["emulated"] is True
            for m in report["models"]:  # every episode ran on the board, none failed
                assert m["reward"]["episodes"] == 2 and None not in m["reward"]["per_episode"], m["reward"]
                # (a Pong fp32 pair that scores no point is said to be in % of one reward unit: a note)
                assert not [w for w in m["warnings"] if "stats.drift_scale" not in w], m["warnings"]
            other = next(m for m in report["models"] if m["precision"] != "fp32")
            assert other["drift"]["paired_episodes"] == 2
            shown = {m["name"]: m["reward"]["per_episode"] for m in report["models"]}
            print(f"[emulated rpi4] {name}: returns {shown} in {_since(t0):.1f} s ({steps}-step episodes)")
    finally:
        assert emu_ssh(board, f"rm -rf .local/share/quarl-edge {wheelhouse.DEVICE_WHEELS}").returncode == 0
        _forget(board, list(bundles.values()))


def _forget(board: emulate.Status, bundles: list[Path]) -> None:
    """Remove the bundles a test uploaded from the board's cache: the cached rootfs stays as built."""
    shas = " ".join(f".cache/quarl-edge/bundles/{sha256_file(b / 'manifest.json')}" for b in bundles)
    assert emu_ssh(board, f"rm -rf {shas}").returncode == 0


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_deploy_then_a_torch_free_script_on_the_board_plays_the_bench_episodes(
    board: emulate.Status, pendulum_bundle: Path, tmp_path: Path
) -> None:
    """`quarl-edge deploy`: the runtime-only wheel and the bundle on the board; then the user's own script,
    run there over SSH, imports only the runtime API (torch is not on the board) and plays three
    closed-loop episodes: the same returns as `bench` on the board, seed for seed (Pendulum: every seed
    scores differently)."""
    r = qe("deploy", "--bundle", pendulum_bundle, "--device", "rpi4-emu", "--model", "onnx-int8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["check"]["torch_imported"] is False and d["model"] == "onnx-int8"
    script = (
        "import json, sys\n"
        "from quarl_edge.runtimes import load_policy\n"
        "p = load_policy(sys.argv[1], model='onnx-int8')\n"
        "env, rets = p.make_env(), []\n"
        "for seed in (1000, 1001, 1002):\n"
        "    obs, _ = env.reset(seed=seed); p.reset(); ret, done = 0.0, False\n"
        "    while not done:\n"
        "        obs, r, term, trunc, _ = env.step(p.act(obs)); ret += float(r); done = term or trunc\n"
        "    rets.append(ret)\n"
        "print(json.dumps({'returns': rets, 'torch': 'torch' in sys.modules, 'where': p.info.runtime}))\n"
    )
    py = shlex.quote(str(profiles.load_profile("rpi4-emu").python))
    path = d["path"].replace("~/", "", 1)
    r = emu_ssh(
        board,
        f"python3 -c 'import torch' 2>/dev/null; echo torch=$?; {py} -I -c {shlex.quote(script)} {shlex.quote(path)}",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch=1" in r.stdout  # not installed on the board at all
    on_board = json.loads(r.stdout.strip().splitlines()[-1])
    assert on_board["torch"] is False
    r = qe("bench", "--bundle", pendulum_bundle, "--device", "rpi4-emu", "--episodes", "3", "--models", "onnx-int8",
            "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    bench = next(m for m in json.loads(r.stdout)["models"] if m["name"] == "onnx-int8")
    assert len(set(on_board["returns"])) == 3 and on_board["returns"] == bench["reward"]["per_episode"]
    print(f"\n[emulated rpi4] deployed {d['model']}: the board's own script returns {on_board['returns']}")
    _forget(board, [pendulum_bundle])
    assert (
        emu_ssh(
            board, f"rm -rf {shlex.quote(path)} && {py} -m pip uninstall -y -q quarl-edge-runtime"
        ).returncode
        == 0
    )


@pytest.mark.emulated
@pytest.mark.timeout(1800)
def test_emulated_board_down_leaves_nothing_and_up_reuses_the_build(
    board: emulate.Status, emu_session: EmuSession
) -> None:
    """`quarl-edge devices emulate rpi4 down` stops sshd by PID, unmounts everything, removes the veth and
    the namespace. The next `up` starts the cached build (keyed by the recipe and the wheels' content:
    nothing is rebuilt) for the emulated tests that follow in the session."""
    pid = board.pid
    assert pid and hostsys.pid_alive(pid)
    rootfs_dir = Path(board.rootfs)
    assert hostsys.mount_points_under(rootfs_dir)
    stamp = emulate.Paths.of(emulate.board("rpi4")).build_stamp
    built = stamp.read_bytes()
    st = emulate_cli("down")
    assert not st.running
    assert not hostsys.pid_alive(pid)
    assert hostsys.pids_rooted_in(rootfs_dir) == []
    assert hostsys.mount_points_under(rootfs_dir) == []
    assert not Path("/run/netns/qe-rpi4").exists()
    assert "qe-rpi4" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path("/sys/class/net/qe-rpi4-h").exists()
    assert emulate.down("rpi4", log=print).running is False  # idempotent

    t0 = time.monotonic()
    st = emulate_cli("up")
    print(f"\n[emulated rpi4] cached start after down: {_since(t0):.1f} s")
    assert st.running and st.pid != pid and st.built
    assert stamp.read_bytes() == built  # the cached rootfs and venv were reused, not rebuilt
    emu_session.status = st
