"""A board is its address, not its profile name: a tune over SSH (a real OpenSSH sshd on 127.0.0.1 that the
test starts, listening on two ports with one host key: two "boards" behind one profile) measures the
latency again when --port names the other one, and reuses it when the same board is named again.

The sshd runs from a temporary folder (its own host key, a client key in authorized_keys) and is stopped
by PID at the end; HOME and XDG_CONFIG_HOME point into tmp folders."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_tune_inputs import small
from test_tune_trust import Logs, assert_ships_what_it_measured

from quarl_edge.devices.profiles import ProfileOverrides
from quarl_edge.tune.search import run_tune

SSHD = Path("/usr/sbin/sshd")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def two_boards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int, int]]:
    """A device profile "tunedev" reaching an sshd on port A; the same sshd also listens on port B."""
    d = tmp_path / "sshd"
    d.mkdir()
    host_key, client_key = _keygen(d / "host"), _keygen(d / "client")
    (d / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
    ports, user = (_free_port(), _free_port()), getpass.getuser()
    lines = [*(f"ListenAddress 127.0.0.1:{p}" for p in ports), f"HostKey {host_key}", f"PidFile {d / 'pid'}",
             f"AuthorizedKeysFile {d / 'authorized_keys'}", f"AllowUsers {user}", "UsePAM no", "StrictModes no",
             "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no"]  # fmt: skip
    (d / "sshd_config").write_text("\n".join(lines) + "\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    pub = Path(f"{host_key}.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"[127.0.0.1]:{p} {pub[0]} {pub[1]}\n" for p in ports))
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    entry = {"host": "127.0.0.1", "port": ports[0], "user": user, "identity": str(client_key),
             "known_hosts": str(known), "python": sys.executable, "cache_dir": str(tmp_path / "board cache"),
             "connect_timeout": 10}  # fmt: skip
    (xdg / "quarl-edge").mkdir(parents=True)
    (xdg / "quarl-edge" / "devices.toml").write_text(
        "[tunedev]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items())
    )
    log = (d / "log").open("wb")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 15
        for port in ports:
            while True:
                assert proc.poll() is None, (d / "log").read_text()[-2000:]
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                assert time.monotonic() < deadline, "sshd did not listen within 15 s"
                time.sleep(0.05)
        yield "tunedev", ports[0], ports[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_another_port_is_another_board_and_its_latency_is_measured_again(
    two_boards: tuple[str, int, int], cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    device, port_a, port_b = two_boards
    out = tmp_path / "tuned"
    first = run_tune(small(cartpole_policy, out, cartpole_calib, device=device))
    assert first.device.transport == "ssh"
    logs = Logs()
    second = run_tune(small(cartpole_policy, out, cartpole_calib, device=device, overrides=ProfileOverrides(port=port_b)),
                      log=logs)  # fmt: skip
    assert logs.having("the device changed") and second.reused_measurements == 0
    assert second.inputs.device_sha256 != first.inputs.device_sha256
    assert second.inputs.policy_sha256 == first.inputs.policy_sha256  # only the board differs
    assert_ships_what_it_measured(out, second)
    # the same board named again (its port given explicitly): every measurement reused
    third = run_tune(
        small(cartpole_policy, out, cartpole_calib, device=device, overrides=ProfileOverrides(port=port_b))
    )
    assert third.reused_measurements > 0 and third.inputs == second.inputs
    assert [r.latency for r in third.candidates] == [r.latency for r in second.candidates]
    assert port_a != port_b
