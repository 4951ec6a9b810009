"""Devices over SSH, against a real OpenSSH sshd on 127.0.0.1 that the tests start (the x86 "device").

The sshd runs from a temporary folder with its own host key, a client key (0600) in authorized_keys,
``UsePAM no`` and ``StrictModes no``; it is stopped by PID at the end, with any session it left.
HOME and XDG_CONFIG_HOME point into tmp folders, so ~/.ssh and ~/.config/quarl-edge are the tests'.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import conftest
import pytest
from conftest import SSHD, Sshd, fingerprint, free_port, keygen

from quarl_edge.bench.partial import BenchInterrupted, partial_path
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import LocalTransport
from quarl_edge.devices.profiles import ProfileOverrides, load_profile, remote_path, write_device_entry
from quarl_edge.devices.remote import SSHTransport
from quarl_edge.devices.ssh import HostKeyError, SSHConnection, SSHError, sh
from quarl_edge.devices.zipapp import build_runner_zip
from quarl_edge.runtimes.errors import InputError

MODELS = ["onnx-fp32", "onnx-fp16", "onnx-int8"]
DEV = "sshdev"
pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]


# ---- the device the tests talk to (the sshd: tests/conftest.py) -------------------------------------

sshd = conftest.sshd  # tests/test_fleet_ssh.py takes the SSH tier's fixtures from this module


@dataclass
class Env:
    home: Path
    config: Path
    known_hosts: Path
    cache: Path

    def device(self, sshd: Sshd, name: str = DEV, **fields: Any) -> str:
        """A [name] table in devices.toml reaching the test sshd; ``fields`` override (None removes)."""
        entry: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": sshd.port,
            "user": sshd.user,
            "identity": str(sshd.client_key),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,
            "cache_dir": str(self.cache),
            "connect_timeout": 5,
            "keepalive_interval": 2,
        }
        entry.update(fields)
        table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in entry.items() if v is not None)
        path = self.config / "devices.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f'\n["{name}"]\n{table}\n')
        return name


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return Env(home, xdg / "quarl-edge", tmp_path / "known_hosts", tmp_path / "remote cache")


@pytest.fixture
def trusted(env: Env, sshd: Sshd) -> Env:
    """The test sshd's host key pinned in the device's known_hosts, and the device entry written."""
    env.known_hosts.write_text(sshd.known_hosts_line())
    env.device(sshd)
    return env


def one_error(p: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "Traceback" not in p.stderr and len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


CFG = BenchConfig(episodes=3, latency_samples=100, warmup=10)


# ---- profiles -------------------------------------------------------------------------------------


def test_builtin_profiles_and_user_overrides(env: Env) -> None:
    for name in ("rpi4", "rpi5", "rpi3b", "jetson-orin-nano", "local"):
        p = load_profile(name)
        assert p.default_threads >= 1 and p.preferred_runtime
        if name != "local":
            assert p.transport == "ssh" and p.arch == "aarch64" and p.cores >= 4 and p.python
    assert load_profile("rpi4").ssh_host == "rpi4"  # a `Host rpi4` block in ~/.ssh/config is enough
    env.config.mkdir(parents=True)
    (env.config / "devices.toml").write_text(
        '[rpi4]\nhost = "10.1.2.3"\nuser = "pi"\n\n[lab]\nextends = "rpi5"\nport = 2200\n'
    )
    p = load_profile("rpi4")
    assert (p.host, p.user, p.cores, p.arch) == ("10.1.2.3", "pi", 4, "aarch64")
    assert p.source[-1] == str(env.config / "devices.toml")
    lab = load_profile("lab")
    assert (lab.port, lab.cpu, lab.transport) == (2200, load_profile("rpi5").cpu, "ssh")
    flagged = load_profile("rpi4", ProfileOverrides(host="10.9.9.9", port=2222, user=None))
    assert (flagged.host, flagged.port, flagged.user) == ("10.9.9.9", 2222, "pi")
    assert flagged.cli_ref() == "rpi4 --host 10.9.9.9 --port 2222"


@pytest.mark.parametrize(
    ("given", "expect"),
    [
        ({"port": "2222"}, "port = '2222' is not an integer"),
        ({"port": True}, "port = 'True' is not an integer"),
        ({"host": 10}, "host = '10' is not a string"),
        ({"python": ["/usr/bin/python3"]}, "python = .* is not a string"),
    ],
)
def test_profile_overrides_of_the_wrong_type_are_refused(given: dict[str, object], expect: str) -> None:
    with pytest.raises(InputError, match=expect):
        ProfileOverrides(**given)  # type: ignore[arg-type]


def test_emulator_entry_is_a_drop_in_and_hand_edits_win(env: Env) -> None:
    fields = {"extends": "rpi4", "host": "10.77.0.2", "port": 22, "user": "root", "emulated": True,
              "identity": "/x/id_ed25519", "known_hosts": "/x/known_hosts", "python": "/opt/venv/bin/python"}  # fmt: skip
    path = write_device_entry("rpi4-emu", fields, comment="written by a test")
    assert path == env.config / "devices.d" / "rpi4-emu.toml"
    p = load_profile("rpi4-emu")
    assert p.emulated and p.known_hosts == "/x/known_hosts" and p.cpu == load_profile("rpi4").cpu
    (env.config / "devices.toml").write_text("[rpi4-emu]\nport = 2022\n")
    assert load_profile("rpi4-emu").port == 2022


@pytest.mark.parametrize(
    ("table", "expect"),
    [
        ('password = "hunter2"', "passwords are never stored"),
        ('passphrase = "x"', "never stored"),
        ('hots = "typo"', "unknown field 'hots'"),
        ('port = "22"', "must be an integer"),
        ('transport = "carrier-pigeon"', "unknown transport"),
        ('extends = "nope"', "unknown device 'nope'"),
    ],
)
def test_bad_user_entries_are_refused(env: Env, table: str, expect: str) -> None:
    env.config.mkdir(parents=True)
    (env.config / "devices.toml").write_text(f"[mine]\n{table}\n")
    with pytest.raises(InputError, match=expect):
        load_profile("mine")


def test_devices_list_and_show_cli(cli: Any, env: Env, sshd: Sshd) -> None:
    env.device(sshd)
    p = cli("devices", "list", "--json")
    assert p.returncode == 0, p.stderr
    names = {d["name"] for d in json.loads(p.stdout)}
    assert {"rpi4", "rpi5", "rpi3b", "jetson-orin-nano", "local", DEV} <= names
    p = cli("devices", "show", DEV, "--port", "2022", "--json")
    assert p.returncode == 0, p.stderr
    shown = json.loads(p.stdout)
    assert shown["port"] == 2022 and shown["host"] == "127.0.0.1" and "password" not in shown
    assert "unknown device 'nope'" in one_error(cli("devices", "show", "nope"))
    p = cli("devices", "check", "local", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["device"]["runtimes"]["onnxruntime"]


def test_runner_zipapp_is_reproducible_and_pure_python() -> None:
    a, b = build_runner_zip(), build_runner_zip()
    assert a.sha256 == b.sha256 and a.data == b.data
    assert "__main__.py" in a.files and "quarl_edge/runtimes/runner.py" in a.files
    assert all(f.endswith(".py") for f in a.files)


# ---- host keys, client keys, reachability ---------------------------------------------------------


def test_keys_are_0600_and_a_readable_identity_is_refused(env: Env, sshd: Sshd, tmp_path: Path) -> None:
    assert stat.S_IMODE(sshd.client_key.stat().st_mode) == 0o600
    loose = Path(shutil.copy(sshd.client_key, tmp_path / "loose_key"))
    loose.chmod(0o644)
    env.device(sshd, identity=str(loose))
    with pytest.raises(InputError, match=r"accessible by others \(mode 0644\); chmod 600"):
        SSHConnection(load_profile(DEV)).connect()


def test_unknown_host_key_is_refused_with_fingerprint_and_trust_command(
    cli: Any, env: Env, sshd: Sshd
) -> None:
    env.device(sshd)
    line = one_error(cli("devices", "check", DEV))
    fp = sshd.fingerprint
    assert "unknown host key" in line and fp in line
    trust_cmd = f"quarl-edge devices trust {DEV} --fingerprint {fp}"
    assert line.endswith(trust_cmd)
    assert not env.known_hosts.exists()
    # a wrong fingerprint trusts nothing; the printed command does, and then the device answers
    assert "nothing trusted" in one_error(cli("devices", "trust", DEV, "--fingerprint", "SHA256:" + "A" * 43))
    p = cli(*shlex.split(trust_cmd)[1:])
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(env.known_hosts.stat().st_mode) == 0o600
    assert env.known_hosts.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    p = cli("devices", "check", DEV, "--json")
    assert p.returncode == 0, p.stderr
    facts = json.loads(p.stdout)["device"]
    assert facts["machine"] == os.uname().machine and facts["runtimes"]["onnxruntime"]
    assert facts["python"] == ".".join(map(str, sys.version_info[:3])) and facts["cores"] >= 1


def test_changed_host_key_is_always_refused(cli: Any, env: Env, sshd: Sshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "impostor")
    env.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {Path(f'{other}.pub').read_text()}")
    env.device(sshd)
    line = one_error(cli("devices", "check", DEV))
    assert "CHANGED" in line and sshd.fingerprint in line and fingerprint(Path(f"{other}.pub")) in line
    assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in line
    # not even the trust command replaces a pinned key
    assert "CHANGED" in one_error(cli("devices", "trust", DEV, "--fingerprint", sshd.fingerprint))
    with pytest.raises(HostKeyError, match="CHANGED"):
        SSHConnection(load_profile(DEV)).connect()


def test_wrong_client_key_is_refused(cli: Any, env: Env, sshd: Sshd, tmp_path: Path) -> None:
    env.known_hosts.write_text(sshd.known_hosts_line())
    env.device(sshd, identity=str(keygen(tmp_path / "stranger")))
    line = one_error(cli("devices", "check", DEV))
    assert f"refused key authentication for user '{sshd.user}'" in line and "ssh-copy-id" in line


def test_ssh_config_and_its_known_hosts_are_honoured(env: Env, sshd: Sshd) -> None:
    """A profile with no address at all: ~/.ssh/config's Host block says where, who and with which key."""
    ssh_dir = env.home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "pinned_hosts").write_text(sshd.known_hosts_line())
    (ssh_dir / "config").write_text(
        f"Host {DEV}\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {ssh_dir / 'pinned_hosts'}\n"
    )
    env.device(sshd, host=None, port=None, user=None, identity=None, known_hosts=None)
    with SSHConnection(load_profile(DEV)) as conn:
        assert conn.run(sh("echo", "hello")).stdout == "hello\n"


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A loopback port that drops SYNs: a listener with a full backlog that never accepts."""
    with socket.socket() as lst, socket.socket() as filler:
        lst.bind(("127.0.0.1", 0))
        lst.listen(0)
        filler.connect(lst.getsockname())  # fills the one-entry accept queue
        yield int(lst.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP but never says a word (a hung sshd)."""
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(16)
        yield int(lst.getsockname()[1])


@pytest.mark.parametrize("kind", ["closed", "blackholed", "silent"])
def test_unreachable_device_fails_within_the_timeout(
    cli: Any, env: Env, sshd: Sshd, kind: str, request: pytest.FixtureRequest, cartpole_bundle: Path
) -> None:
    port = {"closed": free_port, "blackholed": lambda: request.getfixturevalue("blackhole"),
            "silent": lambda: request.getfixturevalue("silent_port")}[kind]()  # fmt: skip
    env.device(sshd, port=port, connect_timeout=2)
    # a deadline, not a timing: a transport that ignored its 2 s timeout would hang here and fail the test
    line = one_error(cli("bench", "--bundle", cartpole_bundle, "--device", DEV, timeout=90))
    if kind == "closed":
        assert "connection refused" in line
    else:
        assert "no answer within 2 s" in line
    assert f"127.0.0.1:{port}" in line


# ---- bench over SSH -------------------------------------------------------------------------------


def test_bench_over_ssh_end_to_end_and_second_bench_uploads_nothing(
    trusted: Env, sshd: Sshd, cartpole_bundle: Path
) -> None:
    starts: list[dict[str, Any]] = []
    with SSHTransport(load_profile(DEV)) as t:
        report = bench(
            cartpole_bundle, CFG, device={"name": DEV}, transport=t, progress=starts.append
        ).to_dict()
    h = report["harness"]
    assert h["transport"] == "ssh" and h["connect_s"] > 0 and h["cache_check_s"] > 0
    assert any(f.startswith("runner ") for f in h["uploaded_files"])
    assert {"bundle file manifest.json", "bundle file trace.npz"} <= set(h["uploaded_files"])
    assert h["uploaded_bytes"] > 0 and set(h["runner_startup_s"]) == set(MODELS)
    # the runner that ran is the shipped zipapp, from the device cache, with the device's python
    runner_paths = {e["runner"] for e in starts if e.get("event") == "start"}
    assert len(runner_paths) == 1 and ".pyz" in runner_paths.pop()
    assert list((trusted.cache / "runner").glob("*.pyz")) and list((trusted.cache / "bundles").iterdir())
    dev = report["device"]
    assert dev["name"] == DEV and dev["transport"] == "ssh" and dev["emulated"] is False
    assert dev["machine"] == os.uname().machine and dev["runtimes"]["onnxruntime"] and dev["cpu_model"]
    assert dev["uname"].split()[0] == "Linux" and dev["python"] == ".".join(map(str, sys.version_info[:3]))
    assert [m["name"] for m in report["models"]] == MODELS
    local = bench(cartpole_bundle, CFG).to_dict()
    for remote_m, local_m in zip(report["models"], local["models"], strict=True):
        assert remote_m["latency"]["count"] == CFG.latency_samples and remote_m["latency"]["p50_us"] > 0
        # same seeds, same models, same kernels: the episodes played over SSH are the local ones
        assert remote_m["reward"]["per_episode"] == local_m["reward"]["per_episode"]
        assert remote_m["agreement"] == local_m["agreement"]
        assert not remote_m["warnings"]

    with SSHTransport(load_profile(DEV)) as t:
        again = bench(cartpole_bundle, CFG, device={"name": DEV}, transport=t).to_dict()
    assert again["harness"]["uploaded_files"] == [] and again["harness"]["uploaded_bytes"] == 0


def test_episodes_over_ssh_are_the_local_ones_on_a_policy_whose_returns_vary(
    trusted: Env, sshd: Sshd, pendulum_bundle: Path
) -> None:
    """CartPole scores 500 on every seed, so equal returns there prove little: on Pendulum each seed
    scores differently, and the device plays exactly the local episodes, seed for seed. With --hz the
    device times act() in those episodes, paced at the rate (Pendulum: 200 steps each)."""
    cfg = BenchConfig(episodes=4, latency_samples=20, hz=500)
    with SSHTransport(load_profile(DEV)) as t:
        remote = bench(pendulum_bundle, cfg, device={"name": DEV}, transport=t).to_dict()
    local = bench(pendulum_bundle, cfg).to_dict()
    for r, lo in zip(remote["models"], local["models"], strict=True):
        per_ep = r["reward"]["per_episode"]
        assert len(set(per_ep)) == cfg.episodes, per_ep  # every seed its own return
        assert per_ep == lo["reward"]["per_episode"]
        assert r["agreement"] == lo["agreement"]
        loop = r["in_loop"]
        assert loop["steps"] + loop["no_warmup_steps"] == 4 * 200 and loop["p50_us"] > 0 and loop["hz"] == 500
        assert loop["paced"] and loop["no_warmup_p50_us"] > 0


def test_env_on_host_plays_the_same_episodes_over_ssh_with_policy_and_link_time_apart(
    trusted: Env, sshd: Sshd, pendulum_bundle: Path
) -> None:
    """--env-on-host: the env runs here, the device's `serve` answers one observation per step over the
    SSH channel; seed for seed the same returns as the device's own episodes, and the report says how
    much of each step was the policy on the device and how much the link."""
    cfg = BenchConfig(episodes=3, latency_samples=20)
    with SSHTransport(load_profile(DEV)) as t:
        on_device = bench(pendulum_bundle, cfg, device={"name": DEV}, transport=t).to_dict()
        on_host = bench(
            pendulum_bundle, replace(cfg, env_on_host=True), device={"name": DEV}, transport=t
        ).to_dict()
    for a, b in zip(on_device["models"], on_host["models"], strict=True):
        per_ep = b["reward"]["per_episode"]
        assert len(set(per_ep)) == cfg.episodes and per_ep == a["reward"]["per_episode"]
        link = b["env_on_host"]
        assert a["env_on_host"] is None and link["steps"] == 3 * 200  # Pendulum episodes are 200 steps
        assert 0 < link["policy_us"]["p50"] <= link["round_trip_us"]["p50"]
        assert link["link_us_p50"] == pytest.approx(link["round_trip_us"]["p50"] - link["policy_us"]["p50"])


def test_bench_cli_over_ssh_says_nothing_was_uploaded(
    cli: Any, trusted: Env, sshd: Sshd, cartpole_bundle: Path, tmp_path: Path
) -> None:
    args = (
        "bench",
        "--bundle",
        cartpole_bundle,
        "--device",
        DEV,
        "--episodes",
        "2",
        "--latency-samples",
        "50",
    )
    first = cli(*args, "--out", "first.json")
    assert first.returncode == 0, first.stderr
    assert "uploaded" in first.stderr and "runner start-up" in first.stderr
    p = cli(*args, "--models", "onnx-int8", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["harness"]["uploaded_bytes"] == 0 and report["device"]["transport"] == "ssh"
    assert "nothing uploaded (cached)" in p.stderr
    assert [m["name"] for m in report["models"]] == ["onnx-fp32", "onnx-int8"]
    assert json.loads((tmp_path / "first.json").read_text())["device"]["machine"] == os.uname().machine


EPISODES_CUT = 20


def test_link_cut_mid_bench_keeps_finished_episodes_and_resume_completes(
    cli: Any, trusted: Env, sshd: Sshd, cartpole_bundle: Path, tmp_path: Path
) -> None:
    # enough episodes that the cut, made at fp16's first, lands before its last arrives on a busy machine
    cfg = BenchConfig(episodes=EPISODES_CUT, latency_samples=100)
    out = tmp_path / "reports" / "r.json"
    partial = partial_path(out)
    cut = {"done": False}

    def on_event(ev: dict[str, Any]) -> None:
        # the link drops while onnx-fp16's episodes stream (onnx-fp32 is complete by then)
        if ev.get("event") == "episode" and ev["model"] == "onnx-fp16" and not cut["done"]:
            cut["done"] = True
            sshd.cut_sessions()

    try:
        with SSHTransport(load_profile(DEV)) as t, pytest.raises(BenchInterrupted) as exc:
            bench(cartpole_bundle, cfg, device={"name": DEV}, transport=t, progress=on_event, partial=partial)
    finally:
        sshd.reap_stopped()
    msg = str(exc.value)
    assert "SSH link to sshdev dropped" in msg and str(partial) in msg and "--resume" in msg
    assert "missing: onnx-fp16 (" in msg and "onnx-int8 (everything)" in msg

    saved = json.loads(partial.read_text())
    models = saved["models"]
    assert models["onnx-fp32"]["run"] is not None and len(models["onnx-fp32"]["episodes"]) == EPISODES_CUT
    fp16 = models["onnx-fp16"]
    kept = {e["seed"]: e["ret"] for e in fp16["episodes"]}
    assert 1 <= len(kept) < EPISODES_CUT and fp16["run"] is None
    assert fp16["measured"]["latency"]["count"] == 100  # latency finished before the cut: kept
    assert models["onnx-int8"]["measured"] is None and not models["onnx-int8"]["episodes"]
    assert saved["missing"]["onnx-fp16"]["seeds"] == [s for s in cfg.seeds if s not in kept]
    assert saved["missing"]["onnx-int8"]["status"] == "not measured"
    assert not out.exists()

    p = cli("bench", "--bundle", cartpole_bundle, "--device", DEV, "--episodes", str(EPISODES_CUT), "--latency-samples", "100",
            "--out", out, "--resume", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["resumed"] == {"episodes_kept": EPISODES_CUT + len(kept)}
    # only what was missing ran: fp32 not at all, fp16 without re-measuring latency
    assert set(report["harness"]["runner_startup_s"]) == {"onnx-fp16", "onnx-int8"}
    by_name = {m["name"]: m for m in report["models"]}
    assert by_name["onnx-fp16"]["latency"] == fp16["measured"]["latency"]
    for m in report["models"]:
        assert m["reward"]["episodes"] == len(m["reward"]["per_episode"]) == EPISODES_CUT
        assert m["latency"]["count"] == 100
    per_ep = dict(zip(cfg.seeds, by_name["onnx-fp16"]["reward"]["per_episode"], strict=True))
    assert all(per_ep[s] == r for s, r in kept.items())
    assert by_name["onnx-int8"]["drift"]["paired_episodes"] == EPISODES_CUT
    assert by_name["onnx-int8"]["agreement"] is not None and by_name["onnx-fp16"]["agreement"] is not None
    assert out.is_file() and not partial.exists()


@pytest.mark.timeout(180)  # a deadline: without keepalive the frozen link would hang the bench for ever
def test_a_silent_link_is_detected_by_keepalive(trusted: Env, sshd: Sshd, cartpole_bundle: Path) -> None:
    trusted.device(sshd, name="keepalive", keepalive_interval=0.5, keepalive_count_max=2)
    frozen: dict[str, bool] = {}

    def on_event(ev: dict[str, Any]) -> None:
        if ev.get("event") == "episode" and not frozen:
            frozen["done"] = True
            sshd.freeze_sessions()

    try:
        with SSHTransport(load_profile("keepalive")) as t, pytest.raises(BenchInterrupted) as exc:
            bench(cartpole_bundle, CFG, device={"name": "keepalive"}, transport=t, progress=on_event)
    finally:
        sshd.reap_stopped()
    assert (
        frozen
        and "not responding to keepalive" in str(exc.value)
        and "pass --out to keep them" in str(exc.value)
    )


def test_a_device_without_the_profiles_python_says_how_to_set_it_up(
    cli: Any, trusted: Env, sshd: Sshd
) -> None:
    trusted.device(sshd, name="nopython", python="/nonexistent/venv/bin/python")
    line = one_error(cli("devices", "check", "nopython"))
    assert "no Python at '/nonexistent/venv/bin/python' on nopython" in line
    assert "quarl-edge devices setup nopython" in line


def test_resume_refuses_missing_or_mismatched_partial_results(
    cli: Any, trusted: Env, cartpole_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    line = one_error(cli("bench", "--bundle", cartpole_bundle, "--device", DEV, "--out", out, "--resume"))
    assert "nothing to resume" in line
    # partial results of a local bench (3 episodes) do not resume a 4-episode bench on another device
    with pytest.raises(BenchInterrupted):

        class Dying(LocalTransport):
            def __call__(self, bundle: Path, args: list[str]) -> Iterator[dict[str, Any]]:
                for ev in super().__call__(bundle, args):
                    yield ev
                    if ev.get("event") == "episode":
                        raise SSHError("simulated failure after one episode")

        bench(cartpole_bundle, CFG, transport=Dying(), partial=partial_path(out))
    line = one_error(
        cli(
            "bench", "--bundle", cartpole_bundle, "--device", DEV, "--episodes", "4", "--out", out, "--resume"
        )
    )
    assert "was made with other device, " in line and "seeds" in line and "--resume" in line
    assert partial_path(out).is_file()


def test_shell_metacharacters_in_paths_and_fields_are_passed_safely(
    trusted: Env, sshd: Sshd, cartpole_bundle: Path, tmp_path: Path
) -> None:
    token = f"PWNED-{os.getpid()}"
    evil = f"c a;touch {token}-1 $(touch {token}-2) `touch {token}-3` '\"|&<>*?"
    cache = tmp_path / evil / "cache"
    bundle = Path(shutil.copytree(cartpole_bundle, tmp_path / f"bundle $(touch {token}-4);x"))
    trace = Path(shutil.copy(bundle / "trace.npz", tmp_path / f"t;touch {token}-5;'.npz"))
    model = "onnx-int8"
    trusted.device(sshd, name="evil", cache_dir=str(cache))
    cfg = BenchConfig(episodes=1, latency_samples=20, warmup=1, models=(model,), trace=trace)
    with SSHTransport(load_profile("evil")) as t:
        report = bench(bundle, cfg, device={"name": "evil"}, transport=t).to_dict()
        assert t.ssh.run(sh("printf", "%s", evil)).stdout == evil
    assert report["models"][1]["name"] == model and report["models"][1]["agreement"]["samples"] > 0
    assert (cache / "runner").is_dir() and (cache / "traces").is_dir() and (cache / "bundles").is_dir()
    remote_home = Path(os.path.expanduser(f"~{sshd.user}"))
    for where in (tmp_path, remote_home, Path.cwd(), cache.parent):
        assert not list(where.glob(f"{token}*")), f"a shell ran injected commands in {where}"
    assert (
        remote_path("~/.cache/x", "/home/pi") == "/home/pi/.cache/x" and remote_path("/abs", "/h") == "/abs"
    )
    # a model name is a runner argument and a file stem on the device: one safe alphabet, checked at load
    manifest = json.loads((bundle / "manifest.json").read_text())
    next(m for m in manifest["models"] if m["name"] == "onnx-int8")["name"] = f"int8 $(touch {token}-6);'"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="model name .* is not a safe name"):
        SSHTransport(load_profile("evil")).describe(bundle)
