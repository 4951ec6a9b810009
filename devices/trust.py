"""`quarl-edge devices trust-key NAME KEY.pub`: a board that accepts only bundles signed by keys it trusts.

Only the public key is sent; the board's own runtime (runtimes/signing.py) reads the trust file back, so
what is reported trusted is what the board will enforce.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl_edge.devices import profiles, wheelhouse
from quarl_edge.devices.setup import SIGNING_PACKAGE, SetupError, _last_line
from quarl_edge.runtimes.errors import InputError

_TRUSTED = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); from quarl_edge.runtimes.signing import trusted_keys; "
    "print(json.dumps(sorted(trusted_keys())))"
)


@dataclass(frozen=True)
class Trusted:
    device: str
    fingerprint: str
    path: str
    """the board's trust file (absolute)"""
    keys: tuple[str, ...]
    """every fingerprint the board now trusts, as the board's own runtime reads the file"""
    added: bool
    installed: str | None
    """the cryptography version installed for it (None: the board had it)"""


def trust_key(
    name: str, public_key: Path, overrides: profiles.ProfileOverrides | None = None, log: Any = print
) -> Trusted:
    """`devices trust-key NAME KEY.pub`: add the key to the board's trusted keys (which turns "signed
    bundles only" on there), after making sure the board's Python can check signatures. Only the public
    key is sent: a private key is refused before anything connects."""
    from quarl_edge.devices.remote import SSHTransport
    from quarl_edge.runtimes.signing import TRUST_FILE, public_key_line

    fp, line = public_key_line(public_key)
    profile = profiles.load_profile(name, overrides)
    if profile.transport != "ssh":
        raise InputError(f"device {name!r} is this machine, not a board over SSH",
                         f"add the key line to ~/{TRUST_FILE} here by hand")  # fmt: skip
    q = shlex.quote
    with SSHTransport(profile) as t:
        t.prepare()  # the runner, the board's facts
        installed = _ensure_signing_package(t, log)
        home = t.home()
        path = f"{home}/{TRUST_FILE}"
        folder = path.rsplit("/", 1)[0]
        entry = f"{line} trusted-by-quarl-edge"
        r = t.ssh.run(f"mkdir -p -- {q(folder)} && touch -- {q(path)} && chmod 600 -- {q(path)} && "
                      f"if grep -qF -- {q(line)} {q(path)}; then echo present; "
                      f"else printf '%s\\n' {q(entry)} >> {q(path)} && echo added; fi")  # fmt: skip
        if r.exit_status != 0:
            raise SetupError(
                f"cannot write {path} on {name} ({_last_line(r.stderr)})", "check the board's disk"
            )
        keys = t.ssh.run(shlex.join([t.python, "-c", _TRUSTED, t.runner_path]))
    try:
        trusted = tuple(json.loads(keys.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        trusted = ()
    if keys.exit_status != 0 or fp not in trusted:
        raise SetupError(f"{name} does not read {path} back with the key ({_last_line(keys.stderr)})",
                         "check that file on the board: one 'ssh-ed25519 AAAA...' line per key")  # fmt: skip
    return Trusted(name, fp, path, trusted, r.stdout.strip() == "added", installed)


def _ensure_signing_package(t: Any, log: Any) -> str | None:
    """Install cryptography into the profile's venv when its Python lacks it: wheels for the board's
    platform downloaded here, uploaded, pip-installed offline. Returns the version installed (None:
    it was there)."""
    probe = shlex.join([t.python, "-c", f"import {SIGNING_PACKAGE}"])
    if t.ssh.run(probe).exit_status == 0:
        return None
    facts = t.device_facts
    machine, version = str(facts.get("machine") or ""), str(facts.get("python") or "")
    spec = wheelhouse.WheelhouseSpec(arch=machine, python_version=".".join(version.split(".")[:2]),
                                     packages=(SIGNING_PACKAGE,))  # fmt: skip
    spec, pins = wheelhouse.platform_pinned(spec)
    wheels = wheelhouse.download(spec, pins=pins)
    log(f"{t.profile.name}: installing {SIGNING_PACKAGE} ({len(wheels)} wheels) to check signatures there")
    folder = f"{t.cache}/wheels/signing-{spec.key()}"
    for w in wheels:
        t.upload(w.read_bytes(), f"{folder}/{w.name}", f"wheel {w.name}")
    versions = wheelhouse.wheel_versions([w.name for w in wheels])
    pip = [t.python, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
           "--find-links", folder, *(f"{n}=={v}" for n, v in versions.items())]  # fmt: skip
    r = t.ssh.run(f"{shlex.join(pip)} && rm -rf -- {shlex.quote(folder)}", timeout=t.profile.command_timeout)
    if r.exit_status != 0 or t.ssh.run(probe).exit_status != 0:
        raise SetupError(f"could not install {SIGNING_PACKAGE} on {t.profile.name} ({_last_line(r.stderr)})",
                         f"install it there: quarl-edge devices setup {t.profile.name}")  # fmt: skip
    return versions.get(SIGNING_PACKAGE)
