"""A bundle can never write outside itself, on the host or on the board (issue 27, scope 1).

The board is this machine through a real sshd whose sessions start in a login directory of the test's
own (tests/conftest.py ``board``), with the runtime's venv there: what a command does to the board
shows in a scan of that home before and after.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import SSHD, Board, assert_one_error, changed

from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.remote import SSHTransport
from quarl_edge.devices.ssh import sh
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.board import stream_bundle
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import sha256_file

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]
CACHE = ".cache/quarl-edge"
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
EVIL_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttackerAttackerAttackerAttackerAttacker attacker\n"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def crafted_bundle(src: Path, dest: Path) -> Path:
    """The bundle of issue 27: a symlink ``s -> a/b/c/d/e/f`` and manifest paths that climb through it.
    On the host ``s`` resolves six folders deep, so five ``..`` stay inside the bundle and every sha256
    matches; on the board ``s`` is an ordinary folder of the upload and the same five ``..`` reach the
    login directory: the trace lands on ~/.ssh/authorized_keys and a "model" in the venv as a .pth,
    which Python runs at every start."""
    b = Path(shutil.copytree(src, dest))
    (b / "a/b/c/d/e/f").mkdir(parents=True)
    (b / "s").symlink_to("a/b/c/d/e/f")
    up = "s/" + "../" * 5
    keys = b / "a/.ssh/authorized_keys"
    keys.parent.mkdir()
    keys.write_text(EVIL_KEY)
    pth = b / f"a/venv/lib/{PY}/site-packages/x.pth"
    pth.parent.mkdir(parents=True)
    pth.write_text("import os; open(os.path.expanduser('~/PWNED'), 'a').write('ran\\n')\n")
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["trace"] = {**manifest["trace"], "file": up + ".ssh/authorized_keys", "sha256": _sha(keys)}
    fp32 = next(m for m in manifest["models"] if m["name"] == "onnx-fp32")
    manifest["models"].append({**fp32, "name": "x", "file": f"{up}venv/lib/{PY}/site-packages/x.pth",
                               "sha256": _sha(pth), "size_bytes": pth.stat().st_size})  # fmt: skip
    (b / "manifest.json").write_text(json.dumps(manifest))
    return b


def test_the_crafted_bundle_of_issue_27_is_refused_everywhere_and_the_board_is_untouched(
    cli: Any, board: Board, on_board: str, cartpole_bundle: Path, tmp_path: Path
) -> None:
    bundle = crafted_bundle(cartpole_bundle, tmp_path / "crafted")
    before = board.snapshot()
    for args in (("deploy", "--bundle", bundle, "--device", on_board, "--model", "onnx-int8"),
                 ("bench", "--bundle", bundle, "--device", on_board, "--episodes", "1")):  # fmt: skip
        line = assert_one_error(cli(*args))
        assert "'..' segment: not a plain path inside the bundle" in line, line
    with pytest.raises(QuarlError) as e:
        load_policy(bundle, model="onnx-int8")
    assert "'..' segment" in str(e.value) and "\n" not in str(e.value)
    assert changed(before, board.snapshot()) == []
    assert (board.home / ".ssh/authorized_keys").read_text() != EVIL_KEY and not (
        board.home / "PWNED"
    ).exists()

    # the same bundle without the climbing paths still holds a link: refused for that alone
    manifest = json.loads((cartpole_bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(cartpole_bundle / "trace.npz", bundle / "trace.npz")
    with pytest.raises(QuarlError, match=r"'s' is a symlink or lies under one"):
        load_policy(bundle, model="onnx-int8")


def _board_runs(board: Board, device: str, command: str) -> tuple[int | None, str, str]:
    from quarl_edge.devices.ssh import SSHConnection

    with SSHConnection(load_profile(device)) as c:
        r = c.run(command)
    return r.exit_status, r.stdout, r.stderr


@pytest.mark.parametrize(
    "rel",
    [
        "s/../../../../../.ssh/authorized_keys",
        "../../../.ssh/authorized_keys",
        "/tmp/x",
        "a\\..\\..\\x",
        "\uff0e\uff0e/\uff0e\uff0e/x",
        ".complete",
    ],  # fmt: skip
)
def test_the_board_refuses_a_crafted_stream_itself(
    board: Board, on_board: str, cartpole_bundle: Path, rel: str
) -> None:
    """What the host would refuse, sent anyway (an old or modified host): the board's `receive` checks
    every path before writing and leaves neither the file nor its temporary folder."""
    with SSHTransport(load_profile(on_board)) as t:
        t.prepare()  # the runner in the cache
        before = board.snapshot()
        files = [(r, (cartpole_bundle / r).read_bytes()) for r in ("manifest.json", "trace.npz")]
        files.append((rel, EVIL_KEY.encode()))
        sha = sha256_file(cartpole_bundle / "manifest.json")
        cmd = sh(
            t.python, t.runner_path, "receive", "--dest", f"{t.cache}/bundles/{sha}", "--manifest-sha256", sha
        )
        with pytest.raises(QuarlError, match="refused to store the bundle") as e:
            t.board_command(cmd, "store the bundle", stdin=stream_bundle(files))
    assert "\n" not in str(e.value)
    assert changed(before, board.snapshot()) in ([], [f"{CACHE}/bundles"])  # nothing but the cache's folder


def test_a_cut_stream_leaves_nothing_and_a_bundle_tampered_on_the_board_is_refused_there(
    board: Board, on_board: str, cartpole_bundle: Path
) -> None:
    sha = sha256_file(cartpole_bundle / "manifest.json")
    with SSHTransport(load_profile(on_board)) as t:
        t.prepare()
        before = board.snapshot()
        whole = stream_bundle(
            [(r, (cartpole_bundle / r).read_bytes()) for r in ("manifest.json", "trace.npz")]
        )
        cmd = sh(
            t.python, t.runner_path, "receive", "--dest", f"{t.cache}/bundles/{sha}", "--manifest-sha256", sha
        )
        with pytest.raises(QuarlError, match="the upload was cut"):
            t.board_command(cmd, "store the bundle", stdin=whole[: len(whole) // 2])
        assert changed(before, board.snapshot()) in ([], [f"{CACHE}/bundles"])
        t.prepare(cartpole_bundle)  # the real upload: verified there, then named
        cached = board.home / CACHE / "bundles" / sha
        assert (cached / ".complete").is_file() and sorted(p.name for p in cached.iterdir()) == sorted(
            [
                ".complete",
                "manifest.json",
                "trace.npz",
                "policy.fp32.onnx",
                "policy.fp16.onnx",
                "policy.int8.onnx",
            ]
        )
        model = cached / "policy.int8.onnx"
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 1
        model.write_bytes(bytes(data))
        # the board's own checks: the runner's verify, and load_policy through the runner's code
        with pytest.raises(QuarlError, match=r"sha256 mismatch for 'policy.int8.onnx'"):
            t.board_command(sh(t.python, t.runner_path, "verify", "--bundle", f"{t.cache}/bundles/{sha}",
                               "--manifest-sha256", sha), "verify the bundle")  # fmt: skip
        code = ("import sys; sys.path.insert(0, sys.argv[1]); from quarl_edge.runtimes import load_policy\n"
                "from quarl_edge.runtimes.errors import QuarlError\n"
                "try:\n    load_policy(sys.argv[2], model='onnx-int8')\n"
                "except QuarlError as e:\n    print(f'error: {e}', file=sys.stderr); sys.exit(2)\n")  # fmt: skip
        status, _, err = _board_runs(
            board, on_board, sh(t.python, "-c", code, t.runner_path, f"{t.cache}/bundles/{sha}")
        )
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "sha256 mismatch for 'policy.int8.onnx' (onnx-int8)" in err
    shutil.rmtree(cached)


def test_a_file_upload_that_arrives_short_never_takes_its_name(board: Board, on_board: str) -> None:
    """A file upload that arrives short (a cut link: `cat` sees end of input) never takes the final name."""
    with SSHTransport(load_profile(on_board)) as t:
        t.connect()
        target = f"{t.cache}/traces/{'0' * 64}.npz"
        t.ssh.run(sh("rm", "-f", "--", target))
        # stdin shorter than the size the host announces: what a cut link delivers
        data = b"x" * 1000
        with pytest.raises(QuarlError, match="arrived damaged"):
            _short_put(t, data, target)
        assert not (board.home / target).exists()
        assert not [p for p in (board.home / CACHE / "traces").iterdir() if p.name.endswith(".tmp")]


def _short_put(t: SSHTransport, data: bytes, target: str) -> None:
    """_put's command with the whole size and sha256 announced, fed only half the bytes."""
    import quarl_edge.devices.remote as remote

    real_run = t.ssh.run

    def half(cmd: str, **kw: Any) -> Any:
        if isinstance(kw.get("stdin"), bytes):
            kw["stdin"] = kw["stdin"][: len(kw["stdin"]) // 2]
        return real_run(cmd, **kw)

    t.ssh.run = half  # type: ignore[method-assign]
    try:
        remote.SSHTransport._put(t, data, target, "a test file", len(data))
    finally:
        t.ssh.run = real_run  # type: ignore[method-assign]
