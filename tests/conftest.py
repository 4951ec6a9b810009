"""Shared fixtures: the shipped policies, their calibration data, a CLI runner, a CartPole bundle and the
SSH tier's real sshd on loopback."""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# One compute thread per test process (and the CLI processes it starts), set before torch is imported:
# the machine has 2 cores shared by 2 pytest workers, and torch's default of one OpenMP thread per core
# spins against the other worker. Measured on the loaded 2-core machine: a 256-step SAC training 97 s
# with the default, 22 s with one thread. What a test measures with more threads it sets itself.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "quarl_edge" / "assets" / "policies"
CALIB = ROOT / "calibration_data"


@contextlib.contextmanager
def tests_on_pythonpath(single_torch_thread: bool = False) -> Iterator[None]:
    """tests/ on PYTHONPATH for the subprocesses a test starts (the bench runner imports a test env module by
    its env id's module part), and torch on one thread, for the duration; both restored after."""
    import torch

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "tests"), old) if p)
    n = torch.get_num_threads()
    if single_torch_thread:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="session")
def cartpole_policy() -> Path:
    return POLICIES / "cartpole-ppo"


@pytest.fixture(scope="session")
def pendulum_policy() -> Path:
    return POLICIES / "pendulum-sac"


@pytest.fixture(scope="session")
def cartpole_calib() -> Path:
    return CALIB / "cartpole-ppo.npz"


@pytest.fixture(scope="session")
def pendulum_calib() -> Path:
    return CALIB / "pendulum-sac.npz"


CliRun = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> CliRun:
    """Run `quarl-edge ARGS...` as a real subprocess in tmp_path; returns the CompletedProcess."""

    def run(
        *args: str | Path, timeout: float = 600, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200")
        return subprocess.run(
            [sys.executable, "-m", "quarl_edge.cli", *map(str, args)],
            cwd=cwd or tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    return run


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs_in_the_runs_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The tests' own SB3 ``learn()`` calls (verbose=0) log nowhere, but SB3 still makes a folder per call,
    /tmp/SB3-<time> unless SB3_LOGDIR names one: this run's temp folder, removed with it."""
    old = os.environ.get("SB3_LOGDIR")
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3-logs"))
    yield
    if old is None:
        os.environ.pop("SB3_LOGDIR", None)
    else:
        os.environ["SB3_LOGDIR"] = old


def run_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder ``build(folder)`` makes once per test run: under pytest-xdist the first worker that asks
    builds it, the others wait for it and reuse it (session fixtures are per worker; an export or a wheel
    build need not be). The folder is read-only by convention: a test that alters it copies it first."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's own folder (pytest-N), above the workers' popen-gwN folders
    shared = base / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    out, done = shared / name, shared / f"{name}.done"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            if out.exists():  # a worker that failed half-way
                shutil.rmtree(out)
            out.mkdir()
            build(out)
            done.touch()
    return out


def _export_shipped(out: Path, policy: Path, calibration: Path, targets: tuple[str, ...]) -> Path:
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.policy.net import load_checkpoint

    export_bundle(load_checkpoint(policy), BundleRequest(out=out, targets=targets, calibration=calibration))
    return out


def shared_export(
    tmp_path_factory: pytest.TempPathFactory,
    where: str,
    policy: Path,
    calibration: Path,
    targets: tuple[str, ...],
) -> Path:
    """A bundle of a shipped policy exported once per test run (``where``: "folder/bundle-name")."""
    folder, name = where.split("/")
    return (
        run_once(tmp_path_factory, folder, lambda d: _export_shipped(d / name, policy, calibration, targets))
        / name
    )


@pytest.fixture(scope="session")
def cartpole_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """fp32 + fp16 + int8 ONNX bundle of the shipped CartPole PPO (exported once per session)."""
    targets = ("onnx-fp32", "onnx-fp16", "onnx-int8")
    return shared_export(
        tmp_path_factory, "bundle-cartpole/cartpole-ppo", cartpole_policy, cartpole_calib, targets
    )


@pytest.fixture(scope="session")
def zoo_pong() -> tuple[Path, Path]:
    """The trained zoo Pong DQN (Nature-CNN, 2.25M steps) and its 1,000 recorded frames."""
    return POLICIES / "pong-dqn", CALIB / "pong-dqn.npz"


def assert_discriminating(
    actions: Any, n_actions: int, min_distinct: int = 3, max_share: float = 0.6
) -> None:
    """An accuracy check is only as good as its policy: one that takes a single action (a random-init
    CNN picks action 0 on every frame) agrees with any constant model. Fail if it ever becomes so."""
    import numpy as np

    counts = np.bincount(np.asarray(actions, dtype=np.int64).reshape(-1), minlength=n_actions)
    share = counts.max() / counts.sum()
    assert (counts > 0).sum() >= min_distinct and share <= max_share, (
        f"degenerate policy: action counts {counts}"
    )


@pytest.fixture(scope="session")
def pendulum_bundle(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Path:
    """fp32 + int8 ONNX bundle of the shipped Pendulum SAC (continuous actions, returns that vary by seed)."""
    targets = ("onnx-fp32", "onnx-int8")
    return shared_export(
        tmp_path_factory, "bundle-pendulum/pendulum-sac", pendulum_policy, pendulum_calib, targets
    )


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / "quarl-edge"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


_SKIP_COPY = shutil.ignore_patterns(
    ".git", ".venv", "build", ".cache", "*.egg-info", "__pycache__", "out", "runs"
)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """quarl-edge as a user gets it: the wheel built from a clean copy of the source tree, pip-installed
    (no editable finder) into a fresh venv whose dependencies are the test venv's (no download)."""
    work = run_once(tmp_path_factory, "installed-wheel", _build_and_install_wheel)
    (wheel,) = (work / "dist").glob("quarl_edge-*.whl")
    return InstalledWheel(wheel, work / "venv")


def _build_and_install_wheel(work: Path) -> None:
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY)  # a stale build/lib would leak old modules into the wheel
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=600)  # fmt: skip
    (wheel,) = dist.glob("quarl_edge-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=600)  # fmt: skip
    # the test venv's packages, as a plain path entry: its .pth files (our editable finder) do not run
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz-test-venv-deps.pth").write_text("\n".join(deps) + "\n")


def _group(nodeid: str) -> str:
    """What runs together on one pytest-xdist worker: every file whose name says ``emulat`` in one group
    (one emulated board per host: its namespace and /run state have fixed names, so its tests run one
    after another), every other file as a group of its own (module fixtures, e.g. an sshd or a module's
    exports, are made once)."""
    path = nodeid.split("::", 1)[0]
    return "emulated" if "emulat" in Path(path).name else path


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` runs `-n 3`: tests scheduled by _group (pytest-xdist's own `--dist loadgroup` reads
    markers through an attribute pytest 9 no longer has, so it would group nothing)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An emulated test lives in a file whose name says so (the scheduler above keeps those files on one
    worker). Under pytest-xdist, the emulated group first (the longest: a board, then qemu), then the
    HEAVIEST files, then the files with the most tests, so that the workers finish close together
    (`--no-loadscope-reorder`)."""
    misplaced = [
        i.nodeid for i in items if i.get_closest_marker("emulated") and _group(i.nodeid) != "emulated"
    ]
    if misplaced:
        raise pytest.UsageError(
            f"emulated tests must live in a file named test_*emulat*.py (one board per host): {misplaced[0]}"
        )
    _only_for(config, items)
    if not hasattr(config, "workerinput"):
        return
    sizes: dict[str, int] = {}
    for item in items:
        sizes[_group(item.nodeid)] = sizes.get(_group(item.nodeid), 0) + 1

    def order(g: str) -> tuple[bool, int, int]:
        name = Path(g).name
        return g != "emulated", HEAVIEST.index(name) if name in HEAVIEST else len(HEAVIEST), -sizes[g]

    first = {g: i for i, g in enumerate(sorted(sizes, key=order))}
    items.sort(key=lambda item: first[_group(item.nodeid)])


# The files that take longest (a `make test` run's junit, summed per file: 170 s down to 50 s), handed
# out first after the emulated group so that no long file starts last and leaves one worker running alone
# at the end (an order only: a file missing here is scheduled after them, by its number of tests).
HEAVIEST = ("test_tune_noenv.py", "test_actorq.py", "test_export_matrix.py", "test_tune_trust.py", "test_tune.py",
            "test_c_export.py", "test_qat.py", "test_wheel.py", "test_devices_ssh.py", "test_new_user.py",
            "test_trust_signing.py", "test_tune_resume.py", "test_study_ptq.py", "test_actorq_dmc.py",
            "test_export_layers.py", "test_fuzz_tune.py", "test_sb3_import.py", "test_pong_zoo.py",
            "test_contrib_import.py", "test_trainer.py", "test_dmc.py")  # fmt: skip


def _only_for(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.only_for("a", "b")` on a test of a parametrized (module) fixture: the test exists for
    those parameter ids only (deselected for the others, never collected as skips)."""
    keep, drop = [], []
    for item in items:
        mark, spec = item.get_closest_marker("only_for"), getattr(item, "callspec", None)
        (drop if mark and spec is not None and spec.id not in mark.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--fuzz-examples", default=200, type=int, help="cases per artifact in tests/test_fuzz.py"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many fuzz cases ran per artifact; one line naming every tier (test file) that skipped tests,
    and why: nothing skips silently."""
    fuzz = sys.modules.get("test_fuzz")
    counts = getattr(fuzz, "COUNTS", None)
    if counts:
        terminalreporter.write_line("fuzz cases: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    by_file: dict[str, set[str]] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        where = str(rep.location[0]) if getattr(rep, "location", None) else "?"
        reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        by_file.setdefault(where, set()).add(reason.removeprefix("Skipped: "))
    if by_file:
        parts = [f"{f} ({'; '.join(sorted(r))})" for f, r in sorted(by_file.items())]
        terminalreporter.write_line("skipped tiers: " + ", ".join(parts))


# ---- the one-line error contract, shared by the CLI tests of several files ----------------------------

FAST_BENCH = ("--episodes", "2", "--latency-samples", "50")


def assert_one_error(p: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and exactly one non-blank stderr line, starting with `error:`; returns that line."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{p.stderr}"
    assert lines[0].startswith("error:"), lines[0]
    assert len(lines[0]) > len("error: ") + 10
    return lines[0]


def assert_absent(path: Path) -> None:
    """Neither the output nor a temporary sibling (`.name.*.tmp`, `.name.old-*`) is left behind."""
    assert not path.exists(), f"{path} was left behind"
    leftovers = sorted(p.name for p in path.parent.glob(f".{path.name}.*"))
    assert not leftovers, f"temporary files left in {path.parent}: {leftovers}"


def assert_no_report(path: Path) -> None:
    assert_absent(path)
    assert_absent(path.with_suffix(".md"))


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT, as Ctrl-C would: a shell that started
    pytest in the background (``cmd &`` without job control, e.g. under nohup) ignores SIGINT, the
    children inherit that, and the CLI would never see the interrupt (seen in a CI check run so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- the runtime API's bundles: ONNX and LiteRT side by side (tests/test_runtime_*.py) ------------------


@pytest.fixture(scope="session")
def pong_rt_bundle(tmp_path_factory: pytest.TempPathFactory, zoo_pong: tuple[Path, Path]) -> Path:
    """The zoo Pong DQN (uint8 4x84x84 frames) as onnx-int8 and tflite-int8."""
    targets = ("onnx-int8", "tflite-int8")
    return shared_export(tmp_path_factory, "rt-bundle-pong/pong-dqn", zoo_pong[0], zoo_pong[1], targets)


@pytest.fixture(scope="session")
def cartpole_rt_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """The zoo CartPole PPO (discrete) as onnx-fp32, onnx-int8, tflite-fp32 and tflite-int8."""
    targets = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")
    return shared_export(
        tmp_path_factory, "rt-bundle-cartpole/cartpole-ppo", cartpole_policy, cartpole_calib, targets
    )


@pytest.fixture(scope="session")
def pendulum_rt_bundle(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Path:
    """The zoo Pendulum SAC (continuous) as onnx-fp32, onnx-int8, tflite-fp32 and tflite-int8."""
    targets = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")
    return shared_export(
        tmp_path_factory, "rt-bundle-pendulum/pendulum-sac", pendulum_policy, pendulum_calib, targets
    )


# ---- the SSH tier's device: a real OpenSSH sshd on 127.0.0.1 -----------------------------------------

SSHD = Path("/usr/sbin/sshd")


def keygen(path: Path, comment: str = "quarl-edge-test") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True
    )
    return path


def fingerprint(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children first)."""
    parent = {int(d): _ppid(int(d)) for d in os.listdir("/proc") if d.isdigit()}
    out, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen[bytes]
    host_pub: Path
    client_key: Path
    user: str
    stopped: list[int] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.host_pub)

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_pub.read_text().split(' ')[0]} {self.host_pub.read_text().split()[1]}\n"

    def cut_sessions(self) -> None:
        """Drop every SSH connection: freeze what runs in the sessions, kill the sessions' sshd processes."""
        below = descendants(self.proc.pid)
        for pid in below:
            if "sshd" not in cmdline(pid):
                os.kill(pid, signal.SIGSTOP)  # the runner must not finish while the link dies
                self.stopped.append(pid)
        for pid in below:
            if pid not in self.stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def freeze_sessions(self) -> None:
        """A link that goes silent (no FIN, no RST): stop every process of the sessions, sshd included."""
        for pid in descendants(self.proc.pid):
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)

    def reap_stopped(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stopped.clear()


@contextlib.contextmanager
def start_sshd(d: Path, extra_config: tuple[str, ...] = ()) -> Iterator[Sshd]:
    """An OpenSSH sshd on a free loopback port, configured in ``d`` (``extra_config``: more lines of
    sshd_config); stopped by PID at the end, with any session it left."""
    host_key = keygen(d / "host_ed25519", "test-host")
    client_key = keygen(d / "client_ed25519")
    (d / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
    port = free_port()
    user = getpass.getuser()
    (d / "sshd_config").write_text(
        "\n".join(
            [
                f"ListenAddress 127.0.0.1:{port}",
                f"HostKey {host_key}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                f"AllowUsers {user}",
                "UsePAM no",
                "StrictModes no",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "MaxStartups 64",
                "LogLevel VERBOSE",
                *extra_config,
            ]
        )
        + "\n"
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(
            mode=0o755, exist_ok=True
        )  # sshd's privilege-separation dir, as its package makes
    log = (d / "sshd.log").open("wb")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    server = Sshd(d, port, proc, Path(f"{host_key}.pub"), client_key, user)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited with {proc.returncode}: {(d / 'sshd.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                pytest.fail("sshd did not listen within 15 s")
            time.sleep(0.05)
        yield server
    finally:
        server.reap_stopped()
        leftovers = descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """The SSH tier's device: this machine through a real sshd (one per test module)."""
    with start_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@dataclass
class Board:
    """A board of its own over SSH: a real sshd whose sessions start in ``home`` (their HOME too), with
    a venv at ``home/venv`` whose packages are the test venv's (a path entry: no quarl_edge in it until
    ``deploy`` installs the runtime wheel). What a command does to the board shows in ``snapshot``."""

    sshd: Sshd
    home: Path

    @property
    def python(self) -> Path:
        return self.home / "venv" / "bin" / "python"

    def device(self, config: Path, known_hosts: Path, name: str = "board", **fields: Any) -> str:
        """A [name] table in ``config``/devices.toml reaching this board (host key pinned)."""
        known_hosts.write_text(self.sshd.known_hosts_line())
        entry: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.sshd.port,
            "user": self.sshd.user,
            "identity": str(self.sshd.client_key),
            "known_hosts": str(known_hosts),
            "python": str(self.python),
            "connect_timeout": 5,
            "keepalive_interval": 2,
            **fields,
        }
        config.mkdir(parents=True, exist_ok=True)
        table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in entry.items() if v is not None)
        with (config / "devices.toml").open("a") as f:
            f.write(f'\n["{name}"]\n{table}\n')
        return name

    def snapshot(self) -> dict[str, str]:
        """Every entry under the board's home, never following a link: a file by its sha256, a link by
        its target, a folder as such."""
        out: dict[str, str] = {}
        for root, dirs, files in os.walk(self.home):
            for n in dirs + files:
                p = Path(root) / n
                rel = str(p.relative_to(self.home))
                if p.is_symlink():
                    out[rel] = "link -> " + os.readlink(p)
                elif p.is_dir():
                    out[rel] = "dir"
                else:
                    out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        return out


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The entries that appeared, went or changed between two Board.snapshot()s."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


@contextlib.contextmanager
def make_board(d: Path, login: Path | None = None) -> Iterator[Board]:
    """A :class:`Board` in ``d``: its sessions start in ``login`` (default: its home, with HOME pointing
    at the home either way)."""
    home = d / "home"
    home.mkdir()
    venv = home / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz-test-venv-deps.pth").write_text("\n".join(deps) + "\n")
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "authorized_keys").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB0ard0wner board-owner\n"
    )
    (d / "sshd").mkdir()
    start = shlex.quote(str(login)) if login else '"$HOME"'
    extra = (f"SetEnv HOME={home}", f'ForceCommand cd {start} && exec "$SHELL" -c "$SSH_ORIGINAL_COMMAND"')
    with start_sshd(d / "sshd", extra) as server:
        yield Board(server, home)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Board]:
    """A login directory of the board's own: sessions start there with HOME pointing at it."""
    with make_board(tmp_path_factory.mktemp("board")) as b:
        yield b


@pytest.fixture(scope="module")
def away_board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Board, Path]]:
    """A board whose sessions start in a login directory other than its $HOME (an sshd_config
    ChrootDirectory/ForceCommand, a shared service account): ``~`` must still mean $HOME. Returns the
    board and that login directory (which nothing of ours may touch)."""
    d = tmp_path_factory.mktemp("away-board")
    login = d / "login"
    login.mkdir()
    with make_board(d, login) as b:
        yield b, login


@pytest.fixture
def on_board(board: Board, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The host side of a test against ``board``: HOME and XDG_CONFIG_HOME of the test's own, and a
    device entry ``board`` (strict host key pinned). Returns the device's name."""
    monkeypatch.setenv("HOME", str(tmp_path / "host-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "host-home").mkdir()
    return board.device(tmp_path / "xdg" / "quarl-edge", tmp_path / "known_hosts")


# ---- C export (issue 31): zoo bundles with ONNX and C models, exported once per session ------------

C_TARGETS = ("onnx-fp32", "onnx-int8", "c-fp32", "c-int8")


@pytest.fixture(scope="session")
def c_bundle(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name -> a bundle of that zoo policy with C_TARGETS, exported on first use, once per session."""
    root = tmp_path_factory.mktemp("c-bundles")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _export_shipped(root / name, POLICIES / name, CALIB / f"{name}.npz", C_TARGETS)
        return made[name]

    return get


# ---- the emulated tier's board: `quarl-edge devices emulate rpi4 up`, once per session ----------------


def can_emulate() -> str | None:
    """Why this host cannot run the emulated board, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (debootstrap, chroot, mounts, network namespaces)"
    if shutil.which("apt-get") is None and shutil.which("debootstrap") is None:
        return "needs debootstrap (or apt-get to install it)"
    return None


def qe(*args: str | Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """The user's command line: `quarl-edge ARGS...` in a child process (environment as the test sets it)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "quarl_edge.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def emulate_cli(action: str) -> Any:
    """`quarl-edge devices emulate rpi4 ACTION --json`; its status as the CLI printed it."""
    from quarl_edge.devices import emulate

    r = qe("devices", "emulate", "rpi4", action, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    print(r.stderr.strip())
    return emulate.Status(**json.loads(r.stdout))


def emu_ssh(st: Any, command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Plain OpenSSH to the emulated board: strict host-key checking against the pinned known_hosts, key
    auth only."""
    argv = ["ssh", "-i", str(st.identity), "-o", f"UserKnownHostsFile={st.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-p", str(st.port), f"root@{st.address}", command]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def emu_scp(st: Any, local: list[Path], remote: str) -> None:
    argv = ["scp", "-q", "-r", "-i", str(st.identity), "-o", f"UserKnownHostsFile={st.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-P", str(st.port),
            *map(str, local), f"root@{st.address}:{remote}"]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=300)


@dataclass
class EmuSession:
    """The session's emulated board: its status as `up` printed it, and the private config dir that holds
    its device entry (``rpi4-emu``)."""

    status: Any
    config: Path


@pytest.fixture(scope="session")
def emu_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmuSession]:
    """`quarl-edge devices emulate rpi4 up` once for the whole run (timed: a fresh build, or a cached start
    when the rootfs and wheelhouse, keyed by their content, are already in the cache), its device entry in
    a private config dir; `down` at the end of the session. Every emulated test, in any file, shares it."""
    from quarl_edge.devices import emulate

    reason = can_emulate()
    if reason:
        pytest.skip(reason)
    before = emulate.status("rpi4")
    if before.running:
        pytest.skip("rpi4-emu is already running here; `quarl-edge devices emulate rpi4 down` first")
    config = tmp_path_factory.mktemp("emu-config")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CONFIG_HOME", str(config))
    try:
        t0 = time.monotonic()
        st = emulate_cli("up")
        kind = "cached start" if before.built else "fresh build + start"
        print(f"\n[emulated rpi4] {kind}: {time.monotonic() - t0:.1f} s "
              f"(build {st.build_seconds} s, sshd start {st.start_seconds} s)")  # fmt: skip
        if not before.built:  # both figures: a fresh build, then a cached start
            emulate_cli("down")
            t1 = time.monotonic()
            st = emulate_cli("up")
            print(f"[emulated rpi4] cached start: {time.monotonic() - t1:.1f} s")  # figures, not asserts
        size = (st.rootfs_size_bytes or 0) / 2**20
        print(f"[emulated rpi4] rootfs {size:.0f} MiB at {st.rootfs}; runtimes {st.runtimes}")
        mp.undo()
        yield EmuSession(st, config)
    finally:
        mp.undo()
        if emulate.status("rpi4").running:
            emulate.down("rpi4", log=print)


@pytest.fixture
def emu_board(emu_session: EmuSession, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's emulated Raspberry Pi 4 (an `emulate.Status`), with XDG_CONFIG_HOME pointing at the
    config dir holding its device entry for this test (and the `quarl-edge` processes it starts)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(emu_session.config))
    return emu_session.status
