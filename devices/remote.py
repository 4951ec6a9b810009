"""Bench on a device over SSH: ship the runner and the bundle once, run each model there, stream events.

Remote cache (``cache_dir`` of the profile, default ``~/.cache/quarl-edge``), all content-addressed::

    runner/<sha256>.pyz                  the runner zipapp (quarl_edge.devices.zipapp)
    bundles/<key>/                       manifest.json, the model files, trace.npz, .complete
    traces/<sha256>.npz                  a --trace given on the command line

A bundle's key is its manifest's sha256 (the manifest names the sha256 of every file, so its own names
the whole bundle), with the signature's first 16 hex digits after a ``-`` when it is signed. Entries
appear atomically, so one probe command tells what is there; a second bench uploads nothing.

A bundle goes up as one stream to the runner's ``receive`` (runtimes/board.py), which checks every path,
recomputes every sha256 on the board against the manifest the host named, and renames the folder into
place only then. The other files go up through ``cat`` into a ``.NAME.$$.XXXXXXXX.tmp`` file, checked for
size and sha256 before the rename. What a cut session leaves (its PID no longer runs) is removed by the
next session's ``info --clean-cache``. The runner still checks the model's sha256 when it loads it.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quarl_edge.devices.link import PolicyLink
from quarl_edge.devices.profiles import HOME_COMMAND, DeviceProfile, parse_home, remote_path
from quarl_edge.devices.ssh import SSHConnection, SSHError, sh
from quarl_edge.devices.zipapp import RunnerZip, build_runner_zip
from quarl_edge.runtimes.board import COMPLETE, stream_bundle
from quarl_edge.runtimes.bundlepath import read_file
from quarl_edge.runtimes.errors import IntegrityError, QuarlError
from quarl_edge.runtimes.fsutil import sha256_bytes, sha256_file
from quarl_edge.runtimes.manifest import MANIFEST_NAME, bundle_files, load_manifest
from quarl_edge.runtimes.schema import Event, JSONObject
from quarl_edge.runtimes.signing import SIGNATURE_NAME, TRUST_FILE, check_signature, parse_public_line

Preflight = Callable[[JSONObject, int], None]
"""``preflight(facts, bytes_to_upload)``: raises to stop a bench the device cannot run (devices/preflight.py)"""
MAX_BUNDLE_FILE = 1 << 32  # a model for a Pi-class board is MBs; the stream is built in memory
INFO_TIMEOUT_S = 120.0  # `info` imports every runtime; on a Pi 3 under load that takes a while


@dataclass
class LinkTimings:
    """What reaching the device has cost so far (a bench report's harness; `devices check` prints it)."""

    connect_s: float | None = None
    cache_check_s: float | None = None
    upload_s: float = 0.0
    uploaded_files: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    info_s: float | None = None


@dataclass(frozen=True)
class CachedBundle:
    local: Path
    remote: str
    files: tuple[str, ...]
    sha256: str
    """of manifest.json"""
    signature_sha256: str | None = None
    """of manifest.sig, when the bundle is signed"""

    def key_args(self) -> list[str]:
        """The runner's ``--manifest-sha256 X [--signature-sha256 Y]``: what the board checks against."""
        sig = ["--signature-sha256", self.signature_sha256] if self.signature_sha256 else []
        return ["--manifest-sha256", self.sha256, *sig]


class SSHTransport:
    """The ``ssh`` bench transport (the Transport protocol: quarl_edge/bench/transport.py): the device
    runner over SSH."""

    name = "ssh"

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self.ssh = SSHConnection(profile)
        self._home: str | None = None
        self.runner: RunnerZip | None = None
        self.bundles: dict[Path, CachedBundle] = {}
        self.traces: dict[Path, str] = {}
        self.device_facts: JSONObject = {}
        self._board_keys: dict[str, str] | None = None
        self.timings = LinkTimings()

    def __enter__(self) -> SSHTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.ssh.close()

    @property
    def cache(self) -> str:
        """The profile's cache_dir on the board, absolute (``~`` is the board's $HOME)."""
        return remote_path(self.profile.cache_dir, self.home())

    @property
    def python(self) -> str:
        """The profile's python on the board: absolute, or a bare name found on the board's PATH."""
        p = self.profile.python
        return remote_path(p, self.home()) if "/" in p or p.startswith("~") else p

    def runner_zip(self) -> RunnerZip:
        if self.runner is None:
            self.runner = build_runner_zip()
        return self.runner

    @property
    def runner_path(self) -> str:
        return f"{self.cache}/runner/{self.runner_zip().name}"

    # -- preparing the device -----------------------------------------------------------------------

    def connect(self) -> None:
        if self.timings.connect_s is None:
            self.ssh.connect()
            self.timings.connect_s = self.ssh.connect_s

    def prepare(self, bundle: Path | None = None, trace: Path | None = None,
                preflight: Preflight | None = None) -> None:  # fmt: skip
        """Connect, upload what the device lacks (runner, bundle, trace), read its facts. Idempotent.
        ``preflight(facts, bytes_to_upload)`` runs once the facts are known and before the bundle and
        trace uploads: it raises to stop a bench the device cannot run (devices/preflight.py)."""
        self.connect()
        wanted: list[tuple[str, str]] = []  # (kind, remote path to probe)
        if bundle is not None and Path(bundle) not in self.bundles:
            cb = self.describe(Path(bundle))
            self.check_trust(cb)
            self.bundles[Path(bundle)] = cb
            wanted.append(("bundle", cb.remote))
        if trace is not None and Path(trace) not in self.traces:
            self.traces[Path(trace)] = f"{self.cache}/traces/{sha256_file(trace)}.npz"
            wanted.append(("trace", self.traces[Path(trace)]))
        probe = [self.runner_path] if not self.device_facts else []
        probe += [f"{r}/{COMPLETE}" if kind == "bundle" else r for kind, r in wanted]
        present: dict[str, bool] = {}
        if probe:
            t0 = time.perf_counter()
            present = self._exists(probe)
            self.timings.cache_check_s = (self.timings.cache_check_s or 0.0) + time.perf_counter() - t0
        if self.runner_path in present and not present[self.runner_path]:
            t0 = time.perf_counter()
            rz = self.runner_zip()
            self._upload_bytes(rz.data, self.runner_path, f"runner {rz.name}")
            self.timings.upload_s += time.perf_counter() - t0
        if not self.device_facts:
            t0 = time.perf_counter()
            self.device_facts = self._device_facts()
            self.timings.info_s = time.perf_counter() - t0
        todo = [(k, r) for k, r in wanted if not present.get(f"{r}/{COMPLETE}" if k == "bundle" else r)]
        if preflight is not None:
            preflight(self.device_facts, sum(self._size(k, r) for k, r in todo))
        t0 = time.perf_counter()
        for kind, r in todo:
            if kind == "bundle":
                self._upload_bundle(next(b for b in self.bundles.values() if b.remote == r))
            else:
                local = next(p for p, rr in self.traces.items() if rr == r)
                self._upload_file(local, r, f"trace {local.name}")
        self.timings.upload_s += time.perf_counter() - t0

    def _size(self, kind: str, remote: str) -> int:
        if kind == "bundle":
            cb = next(b for b in self.bundles.values() if b.remote == remote)
            return sum((cb.local / rel).stat().st_size for rel in cb.files)
        return next(p for p, rr in self.traces.items() if rr == remote).stat().st_size

    def describe(self, bundle: Path) -> CachedBundle:
        """What the bundle is in the device's cache: its key, files and hashes (paths checked, no link)."""
        manifest = load_manifest(bundle, verify=False)  # every path plain, no link anywhere in it
        files = bundle_files(manifest)
        sha = sha256_bytes(read_file(bundle, MANIFEST_NAME, MAX_BUNDLE_FILE))
        sig = None
        if (bundle / SIGNATURE_NAME).exists():
            files.append(SIGNATURE_NAME)
            sig = sha256_bytes(read_file(bundle, SIGNATURE_NAME, MAX_BUNDLE_FILE))
        key = f"{sha}-{sig[:16]}" if sig else sha
        return CachedBundle(bundle, f"{self.cache}/bundles/{key}", tuple(files), sha, sig)

    def board_keys(self) -> dict[str, str]:
        """The signing keys the device trusts (its ~/.config/quarl-edge/trusted_keys), read once."""
        if self._board_keys is None:
            r = self.ssh.run(f'cat -- "$HOME"/{shlex.quote(TRUST_FILE)} 2>/dev/null || true')
            keys: dict[str, str] = {}
            for i, line in enumerate(r.stdout.splitlines()[:1000], 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    fp, key = parse_public_line(line, f"line {i} of {self.profile.name}:~/{TRUST_FILE}")
                    keys[fp] = key
            self._board_keys = keys
        return self._board_keys

    def check_trust(self, cb: CachedBundle) -> None:
        """A board that trusts keys takes signed bundles only: refuse others here, before uploading.
        The board checks again itself (runtimes/board.py, the runner, load_policy): it is the authority."""
        keys = self.board_keys()
        if keys:
            data = read_file(cb.local, MANIFEST_NAME, MAX_BUNDLE_FILE)
            check_signature(cb.local, data, True, trusted=keys, machine=self.profile.name)

    def _exists(self, paths: list[str]) -> dict[str, bool]:
        script = "; ".join(f"if [ -e {shlex.quote(p)} ]; then echo 1; else echo 0; fi" for p in paths)
        r = self.ssh.run(script, timeout=self.profile.connect_timeout + 30)
        flags = r.stdout.split()
        if r.exit_status != 0 or len(flags) != len(paths):
            raise SSHError(f"cannot inspect the cache on {self.profile.name}: {r.stderr.strip()[-200:]}")
        return {p: f == "1" for p, f in zip(paths, flags, strict=True)}

    def upload(self, data: bytes, remote: str, what: str) -> None:
        """Put ``data`` at ``remote`` on the device (atomically: a temp name, then mv), once: an existing
        file of a content-addressed path is kept."""
        if not self._exists([remote])[remote]:
            self._upload_bytes(data, remote, what)

    def _upload_bytes(self, data: bytes, remote: str, what: str) -> None:
        self._put(data, remote, what, len(data))

    def _upload_file(self, local: Path, remote: str, what: str) -> None:
        self._put(local, remote, what, local.stat().st_size)

    def _put(self, src: bytes | Path, remote: str, what: str, size: int) -> None:
        parent, _, base = remote.rpartition("/")
        q = shlex.quote
        sha = sha256_bytes(src) if isinstance(src, bytes) else sha256_file(src)
        # $$: the remote shell's PID in the temp name, so the next session can tell a cut upload's leftover
        t = f"{q(f'{parent}/.{base}.')}$$.{secrets.token_hex(4)}.tmp"
        check = f'[ "$(wc -c < "$t")" -eq {size} ]'
        check += (
            f' && {{ ! command -v sha256sum >/dev/null || [ "$(sha256sum < "$t" | cut -c1-64)" = {sha} ]; }}'
        )
        cmd = (f"t={t}; mkdir -p -- {q(parent)} && cat > \"$t\" && {check} && mv -f -- \"$t\" {q(remote)} "
               f'|| {{ rm -f -- "$t"; echo "the upload arrived damaged or could not be stored" >&2; exit 1; }}')  # fmt: skip
        r = self.ssh.run(cmd, stdin=src)
        if r.exit_status != 0:
            raise SSHError(
                f"upload of {what} to {self.profile.name}:{remote} failed: {r.stderr.strip()[-200:]}",
                f"check space and permissions of cache_dir {self.profile.cache_dir!r} on the device",
            )
        self.timings.uploaded_files.append(what)
        self.timings.uploaded_bytes += size

    def _upload_bundle(self, cb: CachedBundle) -> None:
        """One stream to the runner's ``receive``: the board checks and hashes everything before the
        bundle gets its name in the cache (runtimes/board.py)."""
        files = [(rel, read_file(cb.local, rel, MAX_BUNDLE_FILE)) for rel in cb.files]  # never via a link
        if sha256_bytes(files[0][1]) != cb.sha256:
            raise IntegrityError(f"{str(cb.local)!r} changed while it was uploaded", "run the command again")
        cmd = sh(self.python, self.runner_path, "receive", "--dest", cb.remote, *cb.key_args())
        self.board_command(cmd, "store the bundle", stdin=stream_bundle(files))
        self.timings.uploaded_files += [f"bundle file {rel}" for rel, _ in files]
        self.timings.uploaded_bytes += sum(len(d) for _, d in files)

    def board_command(self, cmd: str, what: str, stdin: bytes | None = None) -> JSONObject:
        """Run one of the runner's cache commands (receive, verify, name) and return its answer; the
        board's refusal (a path, a hash, a signature) is one QuarlError line naming the device."""
        r = self.ssh.run(cmd, stdin=stdin, timeout=self.profile.command_timeout)
        lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if answer.get("event") == "error":  # the device's message names the problem and the fix
            raise QuarlError(f"{self.profile.name} refused to {what}: {str(answer.get('message'))[:500]}")
        if r.exit_status != 0 or not answer:
            tail = (r.stderr.strip().splitlines() or [f"exit code {r.exit_status}"])[-1]
            raise SSHError(f"could not {what} on {self.profile.name}: {tail[-300:]}",
                           f"check the device with `quarl-edge devices check {self.profile.name}`")  # fmt: skip
        return answer

    def home(self) -> str:
        """The board's $HOME, absolute, asked once per connection: where ``~`` in the profile points
        (a session may start elsewhere), and what a path printed for Python there needs."""
        if self._home is None:
            self.connect()
            r = self.ssh.run(HOME_COMMAND, timeout=self.profile.connect_timeout + 30)
            self._home = parse_home(r.stdout, r.exit_status, self.profile.name)
        return self._home

    def _device_facts(self) -> JSONObject:
        # the first runner command of a session: it also removes what cut uploads left in the cache
        cmd = sh(self.python, self.runner_path, "info", "--clean-cache", self.cache)
        r = self.ssh.run(cmd, timeout=INFO_TIMEOUT_S)
        if r.exit_status == 127 or (r.exit_status != 0 and "No such file" in r.stderr):
            raise SSHError(
                f"no Python at {self.profile.python!r} on {self.profile.name}",
                f"run `quarl-edge devices setup {self.profile.name}` or set python in the device profile",
            )
        info = next((json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")), None)
        if r.exit_status != 0 or not info:
            tail = (r.stderr.strip().splitlines() or [f"exit code {r.exit_status}"])[-1]
            raise SSHError(
                f"the runner does not start on {self.profile.name} ({tail})",
                f"the device's Python needs numpy and a runtime: quarl-edge devices setup {self.profile.name}",
            )
        info.pop("event", None)
        facts: JSONObject = {
            "name": self.profile.name,
            "transport": "ssh",
            "host": self.ssh.host,
            "port": self.ssh.port,
            "emulated": self.profile.emulated,
            **info,
        }
        if self.profile.arch and info.get("machine") and info["machine"] != self.profile.arch:
            facts["warning"] = f"profile says {self.profile.arch}, the device is {info['machine']}"
        return facts

    # -- running ------------------------------------------------------------------------------------

    def policy_link(self, bundle: Path, model: str, threads: int) -> PolicyLink:
        """The device runner's `serve` for one model: the policy there, the env here (--env-on-host)."""
        self.prepare(bundle)
        cmd = sh(self.python, self.runner_path, "serve", "--bundle", self.bundles[Path(bundle)].remote,
                 "--model", model, "--threads", str(threads))  # fmt: skip
        session = self.ssh.session(cmd)
        try:
            return PolicyLink(session.send, session.readline, session.close, self.profile.name)
        except BaseException:
            session.close()
            raise

    def __call__(self, bundle: Path, args: list[str]) -> Iterator[Event]:
        """Run ``python runner.pyz run --bundle <cached bundle> ARGS`` on the device; yield its events."""
        bundle = Path(bundle)
        args = list(args)
        trace = Path(args[args.index("--trace") + 1]) if "--trace" in args else None
        self.prepare(bundle, trace)
        if trace is not None:
            args[args.index("--trace") + 1] = self.traces[trace]
        cmd = sh(self.python, self.runner_path, "run", "--bundle", self.bundles[bundle].remote, *args)
        for line in self.ssh.stream(cmd):
            line = line.strip()
            if line.startswith("{"):
                yield json.loads(line)
        last = self.ssh.last
        if last.exit_status not in (0, 2):
            tail = (last.stderr.strip().splitlines() or [f"exit code {last.exit_status}"])[-1]
            raise QuarlError(
                f"the runner crashed on {self.profile.name}: {tail}",
                "run again with --debug, or report a bug",
            )
