"""`quarl-edge field pull --device D`: a board's field logs (runtimes.telemetry) fetched over SSH.

On the board, every log folder under ``--from`` (default FIELD_ROOT, where the docs put ``log_dir``; or
``--from`` itself when it is a log folder) is listed with the size and sha256 of each of its files: its
``log.json`` and its closed chunks (the temporary file of a chunk being written is not ours to take).
Here, each log lands in ``OUT/NAME/``; a file already there with the listed sha256 is not fetched again,
so a pull that was cut resumes where it stopped, and chunks the board has since rotated away stay here.
Every fetched file is checked against the board's sha256 before it is renamed into place, and every log is
read back (runtimes.fieldlog: each chunk's content hash) before the pull reports it.

Names and numbers from the board are untrusted: a log or file name that is not one of ours, a size or hash
that is not one, is refused before anything is written.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from quarl_edge.devices.profiles import (
    HOME_COMMAND,
    DeviceProfile,
    ProfileOverrides,
    load_profile,
    parse_home,
    remote_path,
)
from quarl_edge.devices.ssh import SSHConnection, sh
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.fieldlog import CHUNK_RE, HEADER_NAME, FieldLog, load_field_log, read_header
from quarl_edge.runtimes.fsutil import atomic_write_bytes, clean_leftovers, sha256_bytes, sha256_file

FIELD_ROOT = "~/.local/share/quarl-edge/field"
"""where the docs put a board's field logs: ``load_policy(..., log_dir=FIELD_ROOT + "/NAME")``"""
BATCH_BYTES = 8 * 2**20
"""files fetched per SSH command, by size (base64 on the link: a third more)"""
MAX_LISTING = 16 * 2**20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

LIST = r"""
import hashlib, json, os, re, sys
root, chunk = os.path.expanduser(sys.argv[1]), re.compile(sys.argv[2])
def files(d):
    out = []
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if (n == "log.json" or chunk.fullmatch(n)) and os.path.isfile(p) and not os.path.islink(p):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for b in iter(lambda: f.read(1 << 20), b""):
                    h.update(b)
            out.append([n, os.path.getsize(p), h.hexdigest()])
    return out
logs = {}
if os.path.isfile(os.path.join(root, "log.json")):
    logs[os.path.basename(os.path.normpath(root)) or "log"] = [".", files(root)]
elif os.path.isdir(root):
    for n in sorted(os.listdir(root)):
        d = os.path.join(root, n)
        if os.path.isdir(d) and not os.path.islink(d) and os.path.isfile(os.path.join(d, "log.json")):
            logs[n] = [n, files(d)]
print(json.dumps({"exists": os.path.isdir(root), "logs": logs}))
"""
FETCH = r"""
import base64, os, sys
root = os.path.expanduser(sys.argv[1])
for rel in sys.argv[2:]:
    p = os.path.join(root, rel)
    try:
        with open(p, "rb") as f:
            data = base64.b64encode(f.read()).decode()
    except FileNotFoundError:
        data = "-"
    sys.stdout.write(rel + "\t" + data + "\n")
"""


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class PulledLog:
    name: str
    local: str
    fetched: int
    """files fetched this time"""
    kept: int
    """files already here with the board's sha256 (a resumed pull)"""
    gone: int
    """files the board listed and then rotated away before they were fetched"""
    bytes: int
    records: int
    chunks: int
    policy: str
    model: str


@dataclass(frozen=True)
class PullResult:
    device: str
    remote: str
    logs: tuple[PulledLog, ...]


def _listing(text: str, where: str) -> dict[str, tuple[str, list[RemoteFile]]]:
    """The board's listing, every name, size and hash checked before it is used."""
    bad = IntegrityError(
        f"{where} sent a listing that is not one of quarl-edge's", "check the device's python"
    )
    if len(text) > MAX_LISTING:
        raise bad
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise bad from None
    if not isinstance(data, dict) or not isinstance(data.get("logs"), dict):
        raise bad
    out = {}
    for name, entry in data["logs"].items():
        if not (
            isinstance(name, str) and _NAME.fullmatch(name) and isinstance(entry, list) and len(entry) == 2
        ):
            raise IntegrityError(f"{where} lists a log named {str(name)[:60]!r}", "rename it on the device")
        rel, files = entry
        if rel not in (".", name) or not isinstance(files, list):
            raise bad
        parsed = []
        for f in files:
            if not (isinstance(f, list) and len(f) == 3 and isinstance(f[0], str)
                    and (f[0] == HEADER_NAME or CHUNK_RE.fullmatch(f[0])) and isinstance(f[1], int)
                    and not isinstance(f[1], bool) and 0 <= f[1] < 1 << 40
                    and isinstance(f[2], str) and re.fullmatch(r"[0-9a-f]{64}", f[2])):  # fmt: skip
                raise bad
            parsed.append(RemoteFile(*f))
        out[name] = (rel, parsed)
    if not data.get("exists"):
        out = {}
    return out


def _claim_out(out: Path) -> None:
    """``out`` holds field logs only (ours to add to): absent, empty, or log folders and our temp files."""
    if out.is_symlink() or out.exists() and not out.is_dir():
        raise InputError(f"--out {str(out)!r} is not a folder", "pass a folder for the pulled logs")
    if not out.is_dir():
        return
    for entry in out.iterdir():
        if entry.is_dir() and not entry.is_symlink() and (entry / HEADER_NAME).is_file():
            read_header(entry)  # a one-line error when it is not a field log of ours
        elif not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            raise InputError(f"--out {str(out)!r} holds {entry.name!r}, which is not a field log",
                             "pass a folder of pulled field logs, or a new one")  # fmt: skip


def pull(device: str, out: Path, remote: str = FIELD_ROOT, overrides: ProfileOverrides | None = None,
         log: Callable[[str], None] = lambda _m: None) -> PullResult:  # fmt: skip
    """Fetch every field log under ``remote`` on ``device`` into ``out/NAME`` (resumable; hashes checked)."""
    profile = load_profile(device, overrides)
    _claim_out(out)
    with SSHConnection(profile) as ssh:
        if "/" in profile.python or profile.python.startswith("~"):  # ~ is the board's $HOME, asked there
            r = ssh.run(HOME_COMMAND, timeout=profile.connect_timeout + 30)
            home = parse_home(r.stdout, r.exit_status, profile.name)
            profile = replace(profile, python=remote_path(profile.python, home))
        logs = _list(ssh, profile, remote)
        if not logs:
            raise InputError(f"{profile.name} has no field log under {remote!r}",
                             "run the policy there with load_policy(..., log_dir=...) first, or pass --from DIR")  # fmt: skip
        pulled = [
            _pull_log(ssh, profile, remote, name, rel, files, out, log) for name, (rel, files) in logs.items()
        ]
    return PullResult(profile.name, remote, tuple(pulled))


def _python(profile: DeviceProfile) -> str:
    return profile.python  # absolute (pull made it so), or a bare name found on the board's PATH


def _list(ssh: SSHConnection, profile: DeviceProfile, remote: str) -> dict[str, tuple[str, list[RemoteFile]]]:
    r = ssh.run(sh(_python(profile), "-I", "-c", LIST, remote, CHUNK_RE.pattern))
    if r.exit_status != 0:
        raise InputError(f"listing {remote!r} on {profile.name} failed: {r.stderr.strip()[-200:] or r.exit_status}",
                         f"check the profile's python ({profile.python}) and the folder")  # fmt: skip
    return _listing(r.stdout, profile.name)


def _pull_log(ssh: SSHConnection, profile: DeviceProfile, remote: str, name: str, rel: str,
              files: list[RemoteFile], out: Path, log: Callable[[str], None]) -> PulledLog:  # fmt: skip
    local = out / name
    if (local / HEADER_NAME).is_file():
        head = next((f for f in files if f.name == HEADER_NAME), None)
        if head is not None and sha256_file(local / HEADER_NAME) != head.sha256:
            have = read_header(local)
            raise InputError(f"{str(local)!r} holds the log of {have.describe()}, and {profile.name}'s {name!r} "
                             "is another log", "pass another --out")  # fmt: skip
    for f in files:
        clean_leftovers(local / f.name)
    todo = [f for f in files if not ((local / f.name).is_file() and sha256_file(local / f.name) == f.sha256)]
    kept = len(files) - len(todo)
    # the header first: a chunk is never here without the log.json that says what it is
    todo.sort(key=lambda f: f.name != HEADER_NAME)
    fetched = gone = size = 0
    while todo:
        batch: list[RemoteFile] = []
        total = 0
        while todo and (not batch or total + todo[0].size <= BATCH_BYTES):
            total += todo[0].size
            batch.append(todo.pop(0))
        got = _fetch(ssh, profile, remote, [f if rel == "." else RemoteFile(f"{rel}/{f.name}", f.size, f.sha256)
                                            for f in batch])  # fmt: skip
        for f, data in zip(batch, got, strict=True):
            if data is None:  # rotated away on the board since it was listed
                gone += 1
                continue
            if sha256_bytes(data) != f.sha256:
                raise IntegrityError(f"{f.name} of {profile.name}'s field log {name!r} arrived with another sha256 "
                                     "than the board listed", "pull again (it resumes)")  # fmt: skip
            atomic_write_bytes(local / f.name, data)
            fetched, size = fetched + 1, size + len(data)
        log(f"{name}: {fetched} of {fetched + len(todo) + gone} files fetched")
    got_log: FieldLog = load_field_log(local)
    return PulledLog(name, str(local), fetched, kept, gone, size, got_log.records, len(got_log.chunks),
                     got_log.header.policy, got_log.header.model)  # fmt: skip


def _fetch(
    ssh: SSHConnection, profile: DeviceProfile, remote: str, files: list[RemoteFile]
) -> list[bytes | None]:
    r = ssh.run(sh(_python(profile), "-I", "-c", FETCH, remote, *(f.name for f in files)),
                timeout=max(profile.command_timeout, 60.0))  # fmt: skip
    lines = r.stdout.splitlines()
    if r.exit_status != 0 or len(lines) != len(files):
        raise InputError(f"fetching field log files from {profile.name} failed: "
                         f"{r.stderr.strip()[-200:] or r.exit_status}", "pull again (it resumes)")  # fmt: skip
    out: list[bytes | None] = []
    for f, line in zip(files, lines, strict=True):
        rel, _, data = line.partition("\t")
        if rel != f.name:
            raise IntegrityError(f"{profile.name} answered for {rel[:60]!r}, not {f.name!r}", "pull again")
        try:
            out.append(None if data == "-" else base64.b64decode(data, validate=True))
        except binascii.Error:
            raise IntegrityError(
                f"{profile.name} sent {f.name!r} garbled", "pull again (it resumes)"
            ) from None
    return out
