"""Field telemetry (load_policy(..., log_dir=..., log_every=N)): what is recorded, in chunks that are
complete or absent, each hashed and tied to its bundle; rotation; kill -9; a full disk; folders that are
not ours. Real policies and runtimes, a real tmpfs for the full disk, a real SIGKILL."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.fieldlog import (
    FLAG_CLIPPED,
    FLAG_NONFINITE,
    FLAG_OUT_OF_RANGE,
    HEADER_NAME,
    chunk_names,
    load_field_log,
)
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.trace import load_trace


def pushed_out(bundle: Path, n: int = 40) -> np.ndarray:
    """Pendulum observations, every 4th with its angular velocity pushed past the calibration range."""
    obs = load_trace(bundle / "trace.npz").obs[:n].astype(np.float32).copy()
    high = load_manifest(bundle, verify=False).calibration["range"]["high"][2]
    obs[::4, 2] = high + 3.0
    return obs


def test_every_act_is_recorded_with_its_action_time_and_flags(pendulum_bundle: Path, tmp_path: Path) -> None:
    obs = pushed_out(pendulum_bundle)
    with load_policy(pendulum_bundle, model="onnx-int8", log_dir=tmp_path / "log") as policy:
        actions = [policy.act(o) for o in obs]
    stats = policy.log_stats
    assert stats is not None and stats.records == len(obs) and stats.failed is None and stats.chunks == 1
    policy.act(obs[1])  # after close(): it acts on, unlogged
    assert policy.log_stats == stats
    log = load_field_log(tmp_path / "log")
    manifest_sha = policy.info.manifest_sha256
    assert (log.header.manifest_sha256, log.header.model, log.header.model_sha256) == (
        manifest_sha, "onnx-int8", policy.info.sha256)  # fmt: skip
    assert log.records == len(obs) and list(log.step) == list(range(1, len(obs) + 1))
    np.testing.assert_array_equal(log.obs, obs)
    np.testing.assert_array_equal(log.actions, np.stack(actions))
    assert np.all(log.act_ns > 0) and np.all(np.diff(log.t_ns) >= 0)
    assert list(np.flatnonzero(log.flags & FLAG_OUT_OF_RANGE)) == list(range(0, len(obs), 4))
    assert int((log.flags & FLAG_OUT_OF_RANGE).astype(bool).sum()) == policy.stats.out_of_range == 10
    assert not np.any(log.flags & FLAG_CLIPPED)


def test_log_every_nan_and_clip_flags(pendulum_bundle: Path, tmp_path: Path) -> None:
    obs = pushed_out(pendulum_bundle, 12)  # observations 0, 4, 8 out of range
    obs[9] = obs[8]
    obs[5, 0] = np.nan
    policy = load_policy(pendulum_bundle, model="onnx-int8", log_dir=tmp_path / "log", log_every=2,
                         on_out_of_range="clip", on_nonfinite="hold")  # fmt: skip
    for o in obs:
        policy.act(o)
    policy.close()
    log = load_field_log(tmp_path / "log")
    assert list(log.step) == [2, 4, 6, 8, 10, 12]  # act() calls 2, 4, ...: observations 1, 3, 5, ...
    flags = dict(zip(log.step.tolist(), log.flags.tolist(), strict=True))
    assert flags[6] == FLAG_NONFINITE and flags[4] == 0
    assert flags[10] == FLAG_OUT_OF_RANGE | FLAG_CLIPPED  # the 10th observation is out of range: clipped
    assert np.isnan(log.obs[2, 0])  # the record keeps what the sensor gave


def test_a_frame_stacked_policy_logs_what_the_model_saw(pong_rt_bundle: Path, tmp_path: Path) -> None:
    frames = load_trace(pong_rt_bundle / "trace.npz").obs[:6, -1]
    with load_policy(pong_rt_bundle, model="onnx-int8", log_dir=tmp_path / "log") as policy:
        actions = [policy.act(f) for f in frames]
    log = load_field_log(tmp_path / "log")
    assert log.obs.shape == (6, 4, 84, 84) and log.obs.dtype == np.uint8
    np.testing.assert_array_equal(log.obs[:, -1], frames)
    replay = load_policy(pong_rt_bundle, model="onnx-int8")
    assert [replay.act_on_input(x) for x in log.obs] == actions == log.actions.tolist()


def test_a_second_session_appends_and_the_size_cap_rotates_the_oldest(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    obs = load_trace(cartpole_bundle / "trace.npz").obs
    cap = 64 * 1024
    for _ in range(2):
        with load_policy(
            cartpole_bundle, model="onnx-int8", log_dir=tmp_path / "log", log_max_bytes=cap
        ) as p:
            for i in range(3000):
                p.act(obs[i % len(obs)])
        stats = p.log_stats
    assert stats is not None and stats.rotated > 0 and stats.bytes <= cap
    names = chunk_names(tmp_path / "log")
    assert sum((tmp_path / "log" / n).stat().st_size for n in names) <= cap
    log = load_field_log(tmp_path / "log")
    assert log.sessions[-1] == stats.session and log.step[-1] == 3000  # the newest records are the ones kept
    assert log.records < 6000


KILLED = """
import sys
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.loop import LoopConfig, run_loop
from quarl_edge.runtimes.trace import load_trace
bundle, log = sys.argv[1], sys.argv[2]
obs = load_trace(bundle + "/trace.npz").obs
policy = load_policy(bundle, model="onnx-int8", log_dir=log, log_max_bytes=1 << 24)
i = iter(range(10**9))
print("running", flush=True)
run_loop(policy, LoopConfig(2000.0, steps=10**7), read_obs=lambda: obs[next(i) % len(obs)], write_action=lambda a: None)
"""


def test_kill_9_of_a_logging_control_loop_keeps_every_closed_chunk(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(cartpole_bundle), str(log)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "running"
        deadline = time.monotonic() + 120
        while not (log.is_dir() and len(chunk_names(log)) >= 3) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    names = chunk_names(log)
    assert len(names) >= 3, child.stderr.read() if child.stderr else ""
    # what a kill in the middle of a chunk's write leaves: a temporary file of the writer's pid
    partial = log / f".{names[-1][:-10]}999999.npz.{child.pid}.abcd1234.tmp"
    partial.write_bytes((log / names[-1]).read_bytes()[:1000])
    got = load_field_log(log)
    assert got.chunks == tuple(names) and got.leftovers == 1
    assert list(got.step) == list(range(1, got.records + 1))  # every closed record, none lost between chunks
    # the next session on the folder removes the killed writer's leftover once it is stale, and appends
    old = time.time() - 3600
    os.utime(partial, (old, old))
    with load_policy(cartpole_bundle, model="onnx-int8", log_dir=log) as policy:
        policy.act(got.obs[0])
    assert not partial.exists() and load_field_log(log).records == got.records + 1


FULL_DISK = """
import json, sys, warnings
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.fieldlog import load_field_log
from quarl_edge.runtimes.loop import LoopConfig, run_loop
from quarl_edge.runtimes.trace import load_trace
bundle, log = sys.argv[1], sys.argv[2]
obs = load_trace(bundle + "/trace.npz").obs
i = iter(range(10**9))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    # a 64 KiB cap makes ~16 KiB chunks: two fit on the 48 KiB disk beside log.json, the third does not
    policy = load_policy(bundle, model="onnx-int8", log_dir=log, log_max_bytes=64 * 1024)
    r = run_loop(policy, LoopConfig(4000.0, steps=3000), read_obs=lambda: obs[next(i) % len(obs)],
                 write_action=lambda a: None)
    policy.close()
kept = load_field_log(log)
print(json.dumps({"steps": r.steps, "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
                  "stats": policy.log_stats.__dict__, "records": kept.records, "chunks": len(kept.chunks),
                  "last_step": int(kept.step[-1]), "acted": policy.stats.observations,
                  "capacity": policy.log.capacity}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root to mount a tmpfs")
def test_a_full_disk_stops_logging_with_one_warning_and_the_loop_goes_on(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "child.py"
    script.write_text(FULL_DISK)
    mount = f"mount -t tmpfs -o size=48k tmpfs {disk} && exec {sys.executable} {script} {cartpole_bundle} {disk}/log"
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["steps"] == out["acted"] == 3000  # the control loop went on
    assert len(out["warnings"]) == 1 and out["warnings"][0].startswith("FieldLogWarning: field logging to")
    assert (
        "No space left on device" in out["warnings"][0]
        and "the chunks written before are kept" in out["warnings"][0]
    )
    assert out["stats"]["failed"] and out["stats"]["chunks"] == out["chunks"] >= 1
    closed = out["chunks"] * out["capacity"]
    assert out["records"] == out["last_step"] == closed  # every chunk closed before the disk filled, whole
    assert out["stats"]["dropped"] == 3000 - closed


def test_folders_that_are_not_a_field_log_of_this_bundle_are_one_line_errors(
    cartpole_bundle: Path, pendulum_bundle: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(InputError, match="holds files that are not a quarl-edge field log") as e:
        load_policy(cartpole_bundle, model="onnx-int8", log_dir=notes)
    assert "\n" not in str(e.value) and (notes / "todo.txt").read_text() == "mine"
    with pytest.raises(InputError, match="is not a quarl-edge field log"):
        load_field_log(notes)
    (notes / HEADER_NAME).write_text(json.dumps({"format": "someone-else"}))
    with pytest.raises(InputError, match="log.json is another file's"):
        load_field_log(notes)
    ours = tmp_path / "log"
    with load_policy(cartpole_bundle, model="onnx-int8", log_dir=ours) as policy:
        policy.act(np.zeros(4, np.float32))
    for other in ((pendulum_bundle, "onnx-int8"), (cartpole_bundle, "onnx-fp32")):
        with pytest.raises(InputError, match="holds the field log of cartpole-ppo/onnx-int8") as e:
            load_policy(other[0], model=other[1], log_dir=ours)
        assert "give each bundle and model its own log_dir" in str(e.value)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="log_every must be an integer >= 1"):
            load_policy(cartpole_bundle, model="onnx-int8", log_dir=tmp_path / "x", log_every=bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="log_max_bytes must be an integer"):
        load_policy(cartpole_bundle, model="onnx-int8", log_dir=tmp_path / "y", log_max_bytes=10)


def test_a_damaged_or_foreign_chunk_is_named(
    cartpole_bundle: Path, pendulum_bundle: Path, tmp_path: Path
) -> None:
    logs = {}
    for name, bundle, n in (("a", cartpole_bundle, 4), ("b", pendulum_bundle, 3)):
        with load_policy(bundle, model="onnx-int8", log_dir=tmp_path / name) as policy:
            for o in load_trace(bundle / "trace.npz").obs[:n]:
                policy.act(o)
        logs[name] = tmp_path / name / chunk_names(tmp_path / name)[0]
    good = logs["a"].read_bytes()
    data = bytearray(good)
    data[len(good) // 2] ^= 0xFF  # a bit flipped on the way: the zip's CRC
    logs["a"].write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"chunk .*{logs['a'].name}.* is not readable") as e:
        load_field_log(tmp_path / "a")
    assert "pull the log again" in str(e.value)
    with np.load(io.BytesIO(good)) as z:  # an edited record in a well-formed file: the content hash
        arrays = {k: z[k] for k in z.files}
    arrays["obs"][0, 0] += 1.0
    np.savez(logs["a"], **arrays)
    with pytest.raises(IntegrityError, match="does not match its content hash"):
        load_field_log(tmp_path / "a")
    logs["a"].unlink()
    shutil.copy(logs["b"], tmp_path / "a" / logs["b"].name)  # a chunk of the Pendulum log in the CartPole one
    with pytest.raises(IntegrityError, match="belongs to another bundle than its folder's log.json"):
        load_field_log(tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a policy without a log warns about nothing
        load_policy(cartpole_bundle, model="onnx-int8").close()
