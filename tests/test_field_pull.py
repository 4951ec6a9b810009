"""`field pull` from a board over SSH (a real OpenSSH sshd on 127.0.0.1, tests/test_devices_ssh.py): the
control loop runs on the board with telemetry on, the logs come back with the board's sha256 checked, a
second pull fetches only what is new, and what is not ours is refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import test_devices_ssh as ssh_tier
from conftest import ROOT, assert_one_error
from test_devices_ssh import DEV, SSHD, Env, Sshd

from quarl_edge.devices.field import pull
from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.ssh import SSHConnection, sh
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.fieldlog import chunk_names, load_field_log
from quarl_edge.runtimes.trace import load_trace

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]
sshd, env, trusted = ssh_tier.sshd, ssh_tier.env, ssh_tier.trusted
EXAMPLE = ROOT / "examples" / "control_loop.py"


def on_board(*args: str | Path) -> str:
    """Run a command on the board (the test sshd) as a user's script would run there."""
    with SSHConnection(load_profile(DEV)) as ssh:
        r = ssh.run(sh(*map(str, args)), timeout=300)
    assert r.exit_status == 0, r.stderr[-3000:]
    return r.stdout


def test_logs_of_a_loop_on_the_board_come_back_whole_and_a_second_pull_resumes(
    trusted: Env, cartpole_bundle: Path, tmp_path: Path
) -> None:
    board = tmp_path / "board field"  # a space: every path is one quoted word
    out = json.loads(on_board(sys.executable, EXAMPLE, cartpole_bundle, "--model", "onnx-int8", "--hz", "1000",
                              "--steps", "300", "--log-dir", board / "robot-1", "--json").splitlines()[-1])  # fmt: skip
    assert out["steps"] == 300 and out["log"]["records"] == 300
    here = tmp_path / "pulled"
    r = pull(DEV, here, str(board))
    (got,) = r.logs
    assert (got.name, got.records, got.kept, got.gone, got.policy) == ("robot-1", 300, 0, 0, "cartpole-ppo")
    assert got.fetched == len(chunk_names(board / "robot-1")) + 1  # the chunks and log.json
    for name in ["log.json", *chunk_names(board / "robot-1")]:
        assert (here / "robot-1" / name).read_bytes() == (board / "robot-1" / name).read_bytes()
    # more records on the board; a local chunk damaged: the next pull fetches those, keeps the rest
    with load_policy(cartpole_bundle, model="onnx-int8", log_dir=board / "robot-1") as policy:
        for o in load_trace(cartpole_bundle / "trace.npz").obs[:50]:
            policy.act(o)
    first = here / "robot-1" / chunk_names(here / "robot-1")[0]
    first.write_bytes(first.read_bytes()[:-10])
    again = pull(DEV, here, str(board)).logs[0]
    assert (again.fetched, again.kept, again.records) == (2, got.fetched - 1, 350)
    # the board rotates its oldest chunk away: the copy here keeps it
    (board / "robot-1" / chunk_names(board / "robot-1")[0]).unlink()
    third = pull(DEV, here, str(board)).logs[0]
    assert third.fetched == 0 and third.records == 350


def test_pull_cli_and_what_is_not_ours(trusted: Env, cartpole_bundle: Path, pendulum_bundle: Path, cli: Any,
                                       tmp_path: Path) -> None:  # fmt: skip
    board = tmp_path / "board"
    for name, bundle in (("a", cartpole_bundle), ("b", pendulum_bundle)):
        with load_policy(bundle, model="onnx-int8", log_dir=board / name) as policy:
            for o in load_trace(bundle / "trace.npz").obs[:20]:
                policy.act(o)
    (board / "notes").mkdir()  # not a log: not listed
    (board / "a" / "stray.npz").write_bytes(b"x")  # not a chunk name: not fetched
    p = cli("field", "pull", "--device", DEV, "--from", board, "--out", tmp_path / "here", "--json")
    assert p.returncode == 0, p.stderr
    logs = {g["name"]: g for g in json.loads(p.stdout)["logs"]}
    assert sorted(logs) == ["a", "b"] and logs["b"]["policy"] == "pendulum-sac" and logs["a"]["records"] == 20
    assert not (tmp_path / "here" / "a" / "stray.npz").exists()
    np.testing.assert_array_equal(load_field_log(tmp_path / "here" / "b").obs,
                                  load_trace(pendulum_bundle / "trace.npz").obs[:20])  # fmt: skip
    line = assert_one_error(
        cli("field", "pull", "--device", DEV, "--from", board / "notes", "--out", tmp_path / "x")
    )
    assert "has no field log under" in line and "log_dir" in line
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "todo.txt").write_text("mine")
    line = assert_one_error(
        cli("field", "pull", "--device", DEV, "--from", board, "--out", tmp_path / "mine")
    )
    assert "holds 'todo.txt', which is not a field log" in line
    # a local log of the same name that is another log: refused, not overwritten
    (tmp_path / "here" / "b" / "log.json").write_bytes((tmp_path / "here" / "a" / "log.json").read_bytes())
    with pytest.raises(InputError, match="holds the log of cartpole-ppo/onnx-int8 .* is another log"):
        pull(DEV, tmp_path / "here", str(board))


def test_a_board_that_sends_what_is_not_a_log_is_refused(trusted: Env, sshd: Sshd, tmp_path: Path) -> None:
    """The listing is untrusted: a script standing in for the device's python answers with names that
    would leave the output folder; nothing is written."""
    fake = tmp_path / "fake-python"
    listing = {"exists": True, "logs": {"../escape": [".", []]}}
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(listing)}'\n")
    fake.chmod(0o755)
    trusted.device(sshd, "liar", python=str(fake))
    with pytest.raises(IntegrityError, match="lists a log named '../escape'"):
        pull("liar", tmp_path / "out", "/anywhere")
    assert not (tmp_path / "out").exists()
