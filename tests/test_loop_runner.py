"""The loop runner (runtimes.loop.run_loop): absolute deadlines, skip-never-burst after an overrun, the
pre-deadline warm-up that changes nothing, and every OS setting reported, applied or not.

Real policies (the zoo's CartPole and Pong bundles), real gymnasium envs, the real clock; the asserts are
on the loop's invariants (deadlines on the grid, no step before its deadline, no deadline already past
when it was set), never on absolute times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.loop import LoopConfig, LoopResult, run_loop
from quarl_edge.runtimes.realtime import SETTINGS, RealtimeConfig
from quarl_edge.runtimes.trace import load_trace

HZ = 200.0  # a 5 ms period: room for a Python act() and a warm-up on a loaded machine, 30 steps in 0.15 s


def check_grid(r: LoopResult) -> None:
    """The invariants of a loop on absolute deadlines that never bursts."""
    t = r.trace
    assert t is not None and t.deadline_ns.size == r.steps
    period = round(1e9 / r.hz)
    gaps = np.diff(t.deadline_ns)
    assert np.all(gaps % period == 0) and np.all(gaps >= period)  # on the grid, strictly forward
    assert int((gaps // period - 1).sum()) == r.skipped_periods
    assert np.all(t.start_ns >= t.deadline_ns)  # no step starts before its deadline
    ends = t.start_ns + t.work_ns
    assert np.all(t.deadline_ns[1:] > ends[:-1])  # every deadline set was still ahead: never a burst


def test_an_overrun_skips_the_missed_periods_and_never_bursts(cartpole_bundle: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-int8")
    obs = load_trace(cartpole_bundle / "trace.npz").obs
    period_s, slow = 1 / HZ, {6: 3.5, 15: 1.2}  # steps whose actuator write stalls, in periods
    written: list[Any] = []
    i = iter(range(10**6))

    def read_obs() -> np.ndarray:
        return obs[next(i) % len(obs)]

    def write_action(action: Any) -> None:
        written.append(action)
        time.sleep(slow.get(len(written), 0) * period_s)

    r = run_loop(policy, LoopConfig(HZ, steps=30), read_obs=read_obs, write_action=write_action)
    check_grid(r)
    assert r.steps == len(written) == 30
    gaps = np.diff(r.trace.deadline_ns) // round(1e9 / HZ) if r.trace is not None else None
    assert gaps is not None
    # the stalled steps overran; after each, the next step waited for the first deadline still ahead
    assert r.overruns >= 2 and gaps[5] >= 4 and gaps[14] >= 2, gaps
    assert r.skipped_periods >= 4
    assert written == [policy.act(o) for o in obs[:30]]  # the loop acted on every observation, in order


def test_the_warm_up_changes_nothing_the_policy_returns_or_counts(pong_rt_bundle: Path) -> None:
    """A frame-stacked CNN: a warm-up before each step must not push a frame, count or log anything."""
    frames = load_trace(pong_rt_bundle / "trace.npz").obs[:12, -1]  # single frames, as the env gives them
    plain = load_policy(pong_rt_bundle, model="onnx-int8")
    want = [plain.act(f) for f in frames]
    policy = load_policy(pong_rt_bundle, model="onnx-int8")
    got = []
    it = iter(frames)
    r = run_loop(policy, LoopConfig(50.0, steps=12), read_obs=lambda: next(it), write_action=got.append)
    check_grid(r)
    assert got == want
    assert r.warmup_cost is not None and r.warmup_cost.count >= 10  # the warm-up ran before most steps
    assert policy.stats.observations == 12  # the warm-ups were not counted


def test_paced_episodes_are_the_unpaced_ones(cartpole_bundle: Path) -> None:
    """Pacing changes when a step runs, not what it does: the same returns on the same seeds."""
    policy = load_policy(cartpole_bundle, model="onnx-int8")
    env = policy.make_env()
    returns = []
    for seed in (3, 4):
        obs, _ = env.reset(seed=seed)
        policy.reset()
        ret, done, steps = 0.0, False, 0
        while not done and steps < 40:
            obs, reward, term, trunc, _ = env.step(policy.act(obs))
            ret, done, steps = ret + float(reward), term or trunc, steps + 1
        returns.append(ret)
    r = run_loop(policy, LoopConfig(2000.0), env=env, seeds=(3, 4), max_steps=40)
    assert list(r.returns) == returns and sum(r.lengths) == r.steps
    assert [s.name for s in r.settings] == list(SETTINGS)


def test_a_plain_loop_reports_every_setting_as_not_requested(cartpole_bundle: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-int8")
    r = run_loop(policy, LoopConfig.plain(HZ, 5), env=policy.make_env())
    assert [(s.name, s.applied, s.detail) for s in r.settings] == [
        (n, False, "not requested") for n in SETTINGS
    ]
    assert r.warmup_cost is None and r.spin_us == 0 and r.lead_us == 0
    d = json.loads(json.dumps(r.to_dict()))
    assert d["steps"] == 5 and len(d["settings"]) == len(SETTINGS) and "trace" not in d


def test_a_cpu_the_process_may_not_use_is_reported_not_applied(cartpole_bundle: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-int8")
    before = os.sched_getaffinity(0)
    cfg = LoopConfig(HZ, 3, realtime=RealtimeConfig(affinity=(4095,), fifo_priority=None, mlock=False))
    r = run_loop(policy, cfg, env=policy.make_env())
    affinity = next(s for s in r.settings if s.name == "affinity")
    assert not affinity.applied and "CPU 4095 is not one this process may use" in affinity.detail
    assert os.sched_getaffinity(0) == before


CHILD = """
import json, sys
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.loop import LoopConfig, run_loop
policy = load_policy(sys.argv[1], model="onnx-int8")
r = run_loop(policy, LoopConfig(200.0, 5), env=policy.make_env())
print(json.dumps([s.to_dict() for s in r.settings]))
"""


def _settings_in_child(bundle: Path, prefix: list[str]) -> dict[str, dict[str, Any]]:
    p = subprocess.run([*prefix, sys.executable, "-c", CHILD, str(bundle)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return {s["name"]: s for s in json.loads(p.stdout.splitlines()[-1])}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_settings_the_os_refuses_are_reported_with_the_reason_and_the_fix(cartpole_bundle: Path) -> None:
    """Without CAP_SYS_NICE and CAP_IPC_LOCK (and the default RLIMIT_RTPRIO 0, RLIMIT_MEMLOCK of a few
    MiB), SCHED_FIFO and mlockall are refused by the kernel: the loop runs and says so, with the fix."""
    as_root = _settings_in_child(cartpole_bundle, [])
    drop = "-sys_nice,-ipc_lock"
    limited = _settings_in_child(cartpole_bundle, ["prlimit", "--rtprio=0", "--memlock=1048576", "setpriv",
                                                      f"--bounding-set={drop}", f"--inh-caps={drop}"])  # fmt: skip
    assert all(as_root[n]["applied"] for n in SETTINGS), as_root
    fifo, mlock = limited["sched_fifo"], limited["mlockall"]
    assert (
        not fifo["applied"] and "not permitted (EPERM)" in fifo["detail"] and "CAP_SYS_NICE" in fifo["detail"]
    )
    assert "RLIMIT_RTPRIO is 0" in fifo["detail"]
    assert not mlock["applied"] and "RLIMIT_MEMLOCK is 1048576 bytes" in mlock["detail"]
    assert "CAP_IPC_LOCK" in mlock["detail"]
    assert all(limited[n]["applied"] for n in ("affinity", "timer_slack", "gc_freeze")), limited


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hz": 0}, "hz must be a control rate"),
        ({"hz": float("nan")}, "hz must be a control rate"),
        ({"hz": 1e6}, "hz must be a control rate"),
        ({"hz": 50, "steps": 0}, "steps must be an integer >= 1"),
        ({"hz": 50, "lead_us": 20_000}, "lead_us must be None"),
        ({"hz": 50, "spin_us": -1}, "spin_us must be None"),
        ({"hz": 50, "realtime": RealtimeConfig(fifo_priority=None)}, None),
    ],
)
def test_bad_loop_settings_are_one_line_errors(kwargs: dict[str, Any], message: str | None) -> None:
    if message is None:
        LoopConfig(**kwargs)
        return
    with pytest.raises(InputError, match=message) as e:
        LoopConfig(**kwargs)
    assert "\n" not in str(e.value) and "; e.g." in str(e.value)


def test_bad_drivers_and_realtime_settings_are_one_line_errors(cartpole_bundle: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-int8")
    for kw in ({}, {"read_obs": lambda: None}, {"env": policy.make_env(), "write_action": print}):
        with pytest.raises(InputError, match="either env= or both read_obs= and write_action="):
            run_loop(policy, LoopConfig(50), **kw)
    with pytest.raises(InputError, match="steps=None runs until the env's episodes end"):
        run_loop(policy, LoopConfig(50), read_obs=lambda: None, write_action=print)
    for bad in ({"fifo_priority": 100}, {"fifo_priority": True}, {"affinity": "all"}, {"affinity": (-1,)}):
        with pytest.raises(InputError):
            RealtimeConfig(**bad)  # type: ignore[arg-type]
