"""deploy verifies the board and switches names atomically; nothing of ours lands outside our folders
there (issue 27, scopes 3 and 7).

The board is this machine through a real sshd whose sessions start in a login directory of the test's
own, with the runtime's venv there (tests/conftest.py ``board``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SSHD, Board, assert_one_error, changed

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.deploy import DEPLOYED, BoardCheck, deploy
from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.remote import SSHTransport
from quarl_edge.devices.ssh import SSHConnection
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import sha256_file

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]
CACHE = ".cache/quarl-edge"
PAD_BYTES = 48 << 20  # an upload that takes a moment on loopback, so it can be cut half-way


def _board(board: Board, device: str, command: str) -> subprocess.CompletedProcess[str]:
    with SSHConnection(load_profile(device)) as c:
        r = c.run(command)
    return subprocess.CompletedProcess([command], r.exit_status or 0, r.stdout, r.stderr)


def _temps(board: Board) -> list[str]:
    return sorted(str(p.relative_to(board.home)) for p in board.home.rglob("*.tmp"))


def _variant(src: Path, dest: Path, drop: str | None = None, pad: int = 0) -> Path:
    """A copy of ``src`` with other content under the same policy name: a model dropped, or a padding
    model (never loaded) of ``pad`` random bytes."""
    b = Path(shutil.copytree(src, dest))
    manifest = json.loads((b / "manifest.json").read_text())
    if drop:
        manifest["models"] = [m for m in manifest["models"] if m["name"] != drop]
    if pad:
        (b / "pad.onnx").write_bytes(os.urandom(pad))
        fp32 = next(m for m in manifest["models"] if m["name"] == "onnx-fp32")
        manifest["models"].append({**fp32, "name": "pad", "file": "pad.onnx", "size_bytes": pad,
                                   "sha256": sha256_file(b / "pad.onnx")})  # fmt: skip
    (b / "manifest.json").write_text(json.dumps(manifest))
    return b


def test_deploy_names_the_bundle_and_its_printed_line_runs_on_the_board(
    board: Board, on_board: str, cartpole_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    before = board.snapshot()
    d = deploy(cartpole_bundle, on_board, "onnx-int8", name="line-test")
    link = board.home / DEPLOYED / "line-test"
    sha = sha256_file(cartpole_bundle / "manifest.json")
    assert (
        d.path == str(link)
        and link.is_symlink()
        and os.readlink(link) == str(board.home / CACHE / "bundles" / sha)
    )
    assert (
        d.was is None
        and d.now == sha == d.check.manifest_sha256
        and d.change() == f"new name, now {sha[:12]}"
    )
    # the printed line, pasted into a shell on the board: absolute paths, nothing for Python to expand
    line = d.usage()[0]
    assert line.startswith(f"on {on_board}: ") and "~" not in line
    words = shlex.split(line.split(": ", 1)[1])
    assert words[0] == str(board.python) and words[1] == "-c"
    r = _board(board, on_board, line.split(": ", 1)[1])
    assert r.returncode == 0 and r.stdout.strip() in ("0", "1"), (r.stdout, r.stderr)
    # what changed on the board: the cache, the name, the runtime in the venv; nothing else of ours
    outside = [
        c
        for c in changed(before, board.snapshot())
        if not c.startswith((CACHE, ".local/share/quarl-edge", "venv/lib/"))
    ]
    assert set(outside) <= {".cache", ".local", ".local/share"}, outside
    assert not _temps(board)


def test_redeploy_with_new_content_says_was_and_now_and_a_real_folder_is_refused(
    board: Board, on_board: str, cartpole_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    first = cli(
        "deploy",
        "--bundle",
        cartpole_bundle,
        "--device",
        on_board,
        "--model",
        "onnx-int8",
        "--name",
        "redeploy",
    )
    assert first.returncode == 0, first.stderr
    other = _variant(cartpole_bundle, tmp_path / "other", drop="onnx-fp16")
    was, now = sha256_file(cartpole_bundle / "manifest.json"), sha256_file(other / "manifest.json")
    p = cli("deploy", "--bundle", other, "--device", on_board, "--model", "onnx-int8", "--name", "redeploy")
    assert p.returncode == 0, p.stderr
    assert f"(was {was[:12]}, now {now[:12]})" in p.stderr
    link = board.home / DEPLOYED / "redeploy"
    assert os.readlink(link).endswith(now)
    p = cli(
        "deploy",
        "--bundle",
        other,
        "--device",
        on_board,
        "--model",
        "onnx-int8",
        "--name",
        "redeploy",
        "--json",
    )
    assert p.returncode == 0 and json.loads(p.stdout)["was"] == now == json.loads(p.stdout)["now"]

    real = board.home / DEPLOYED / "mine"
    real.mkdir(parents=True)
    (real / "notes.md").write_text("the user's own folder\n")
    before = board.snapshot()
    line = assert_one_error(
        cli("deploy", "--bundle", other, "--device", on_board, "--model", "onnx-int8", "--name", "mine")
    )
    assert f"{real} is a real file or folder, not a name deploy made; refused" in line
    assert changed(before, board.snapshot()) == [] and sorted(os.listdir(real)) == ["notes.md"]
    # the board's own check, at the moment of the switch (a folder made after deploy looked)
    with SSHTransport(load_profile(on_board)) as t:
        t.prepare(other)
        cached = t.bundles[other]
        from quarl_edge.devices.ssh import sh

        with pytest.raises(QuarlError, match="is a real folder, not a name deploy made") as e:
            t.board_command(sh(t.python, t.runner_path, "name", "--bundle", str(board.home / cached.remote),
                               "--root", str(board.home / DEPLOYED), "--name", "mine", *cached.key_args()),
                            "name the bundle")  # fmt: skip
    assert "\n" not in str(e.value) and sorted(os.listdir(real)) == ["notes.md"]


def _wait_for(pred: Any, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return False


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_deploy_cut_mid_upload_leaves_no_temp_folder(
    board: Board, on_board: str, cartpole_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    big = _variant(cartpole_bundle, tmp_path / "big", pad=PAD_BYTES)
    bundles = board.home / CACHE / "bundles"
    key = sha256_file(big / "manifest.json")

    def receiving() -> bool:
        return bundles.is_dir() and any(p.name.startswith(f".{key}.") for p in bundles.iterdir())

    # 1. the client dies: the board's receiver sees its input end and removes its temp folder itself
    args = [sys.executable, "-m", "quarl_edge.cli", "deploy", "--bundle", str(big), "--device", on_board,
            "--model", "onnx-int8", "--name", "cut"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(receiving), "the upload never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _wait_for(lambda: not receiving(), 60), f"the receiver left {_temps(board)}"
    assert not (bundles / key).exists()

    # 2. the link is cut and the receiver killed outright: the next deploy removes what it left
    cut = threading.Thread(target=lambda: _wait_for(receiving) and board.sshd.cut_sessions())
    cut.start()
    try:
        with pytest.raises(QuarlError) as e:
            deploy(big, on_board, "onnx-int8", name="cut")
    finally:
        cut.join()
        stopped = list(board.sshd.stopped)
        board.sshd.reap_stopped()
    assert stopped and _wait_for(lambda: not any(_alive(p) for p in stopped), 30)
    assert "\n" not in str(e.value)
    assert receiving(), "the killed receiver's folder is what the next deploy must clean"
    d = deploy(big, on_board, "onnx-int8", name="cut")
    assert d.now == key and (bundles / key / ".complete").is_file()
    assert not _temps(board), _temps(board)
    shutil.rmtree(bundles / key)


def test_bench_on_the_board_writes_nothing_outside_the_cache_folder(
    board: Board, on_board: str, pendulum_bundle: Path
) -> None:
    """Scope 7: ONNX Runtime 1.32 writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,
    onnxruntime.db} at import (and would send events to mobile.events.data.microsoft.com) unless
    ORT_DISABLE_TELEMETRY=1 is set before it loads; quarl_edge sets it."""
    before = board.snapshot()
    with SSHTransport(load_profile(on_board)) as t:
        report = bench(
            pendulum_bundle,
            BenchConfig(episodes=1, latency_samples=20),
            device={"name": on_board},
            transport=t,
        )
    latency = report.models[0].latency
    assert latency is not None and latency.count == 20
    outside = [c for c in changed(before, board.snapshot()) if not c.startswith(CACHE)]
    assert outside in ([], [".cache"]), outside
    assert not (board.home / ".cache" / "Microsoft").exists()


def test_stale_temp_entries_of_dead_sessions_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    from quarl_edge.runtimes.board import clean_cache

    cache = tmp_path / "cache"
    (cache / "bundles").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = cache / "bundles" / f".{'a' * 64}.{dead.pid}.abcd1234.tmp"
    live = cache / "bundles" / f".{'b' * 64}.{os.getppid()}.abcd1234.tmp"
    mine = cache / "bundles" / f".{'c' * 64}.{os.getpid()}.abcd1234.tmp"
    other = cache / "bundles" / "notes.tmp"
    for p in (gone, live, mine):
        p.mkdir()
    other.write_text("not ours by name")
    later = time.time() + 1
    assert clean_cache(cache, later) == [f"bundles/{gone.name}"]
    assert live.exists() and mine.exists() and other.exists()
    # a PID-named entry younger than this run is another session's that just started: kept
    again = cache / "bundles" / f".{'d' * 64}.{dead.pid}.abcd1234.tmp"
    again.mkdir()
    assert clean_cache(cache, time.time() - 60) == [] and again.exists()


def _check_line(**changes: object) -> str:
    good = {"model": "onnx-int8", "runtime": "onnxruntime", "action": [0.5, -1], "manifest_sha256": "a" * 64,
            "sha256": "b" * 64, "torch_imported": False, "python": "/venv/bin/python"}  # fmt: skip
    return "a warning first\n" + json.dumps({**good, **changes}) + "\n"


def test_the_boards_check_result_is_read_as_a_typed_check_and_a_bad_one_refused() -> None:
    check = BoardCheck.parse(_check_line(), "rpi4")
    assert check.runtime == "onnxruntime" and check.action == [0.5, -1] and not check.torch_imported
    assert check.to_dict() == json.loads(
        _check_line().splitlines()[-1]
    )  # the --json output, as printed there
    assert BoardCheck.parse(_check_line(action=1), "rpi4").action == 1  # a discrete action
    for bad, expect in [
        ({"sha256": "f00"}, "sha256 is not a sha256"),
        ({"torch_imported": "no"}, "torch_imported is not true or false"),
        ({"action": ["left"]}, r"action\[0\] is not a number"),
        ({"model": ""}, "model is not a non-empty string"),
    ]:
        with pytest.raises(QuarlError, match=f"the check on rpi4 printed a malformed result .*{expect}"):
            BoardCheck.parse(_check_line(**bad), "rpi4")
    with pytest.raises(QuarlError, match="the check on rpi4 printed no result"):
        BoardCheck.parse("Traceback ...\n", "rpi4")
