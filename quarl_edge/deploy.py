"""`quarl-edge deploy --bundle B --device D [--model M] [--name N]`: the runtime and the chosen model on the board.

Over the device's SSH link (strict host keys, key auth, every argument quoted): the pre-flight (a runtime
for the model's format there, disk), the bundle into the device's content-addressed cache (as a bench
uploads it: nothing again if it is there; the board checks every path and recomputes every sha256 of
what it received), the runtime-only wheel (devices/runtime_wheel.py, torch-free) pip-installed offline
into the profile's venv, then the board's runner verifies the cached copy against the host's manifest
once more (and its signature, when the board requires one) and switches the stable name
``~/.local/share/quarl-edge/bundles/NAME`` to it atomically (a new link renamed over the old one; a real
folder at the name is refused, never written into). Last, a check on the board that ``load_policy``
loads that very manifest and model, acts, and has not imported torch. Returns the lines to use it
there, with the board's absolute paths (Python does not expand ``~``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl_edge.devices.preflight import check_ready
from quarl_edge.devices.profiles import ProfileOverrides, load_profile
from quarl_edge.devices.runtime_wheel import build_runtime_wheel
from quarl_edge.devices.ssh import sh
from quarl_edge.runtimes.bundlepath import safe_name
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.selection import choose_model

DEPLOYED = ".local/share/quarl-edge/bundles"
"""the stable names, under the board's home"""
NAME_FIX = "pass --name NAME (letters, digits, '.', '_', '-'; not starting with '.' or '-')"
CHECK = """import json, sys
import numpy as np
from quarl_edge.runtimes import load_policy
p = load_policy(sys.argv[1], model=sys.argv[2])
a = p.act(p.zero_observation())
print(json.dumps({"model": p.info.model, "runtime": p.info.runtime, "action": np.asarray(a).tolist(),
                  "manifest_sha256": p.info.manifest_sha256, "sha256": p.info.sha256,
                  "torch_imported": "torch" in sys.modules, "python": sys.executable}))
"""


@dataclass(frozen=True)
class Deployed:
    device: str
    model: str
    path: str
    """the bundle's stable name on the device, an absolute path"""
    python: str
    check: dict[str, Any]
    now: str
    """the sha256 of the manifest deployed"""
    was: str | None
    """the sha256 of the manifest the name pointed at before (None: a new name)"""
    warnings: tuple[str, ...] = ()
    """said before the upload too (through ``log``), e.g. a bundle tuned on another device"""

    def change(self) -> str:
        if self.was is None:
            return f"new name, now {self.now[:12]}"
        if self.was == self.now:
            return f"unchanged, {self.now[:12]}"
        return f"was {self.was[:12]}, now {self.now[:12]}"

    def usage(self) -> list[str]:
        """The line to paste into a shell on the board, and where the API is described."""
        # JSON strings are Python literals too, in double quotes: the shell's single quotes stay plain
        code = (f"from quarl_edge.runtimes import load_policy; p = load_policy({json.dumps(self.path)}, "
                f"model={json.dumps(self.model)}); p.reset(); print(p.act(p.make_env().reset(seed=0)[0]))")  # fmt: skip
        return [f"on {self.device}: {shlex.quote(self.python)} -c {shlex.quote(code)}",
                "docs: docs/runtime.md (load_policy, reset, act, info; examples/control_loop.py)"]  # fmt: skip


def deploy(bundle: Path, device: str, model: str | None = None, overrides: ProfileOverrides | None = None,
           log: Any = lambda _m: None, name: str | None = None) -> Deployed:  # fmt: skip
    from quarl_edge.devices.remote import SSHTransport

    profile = load_profile(device, overrides)
    if profile.transport != "ssh":
        raise InputError(f"device {device!r} is this machine: deploy puts the runtime on a board over SSH",
                         "pass device=NAME of a board (quarl-edge devices list); here: pip install quarl-edge",
                         cli_fix="pass --device NAME of a board (quarl-edge devices list); here: pip install quarl-edge")  # fmt: skip
    manifest = load_manifest(bundle)  # every path and hash, before anything goes to the board
    entry, _ = choose_model(manifest, model, bundle)
    warned = tuple(w for w in (tuned_elsewhere(manifest.tune, profile.name),) if w)
    for w in warned:
        log(f"warning: {w}")
    name = safe_name(name or manifest.policy.name or Path(bundle).name, "bundle name", NAME_FIX, 64)
    wheel = build_runtime_wheel()
    with SSHTransport(profile) as t:
        t.connect()
        home = t.home()
        link = f"{home}/{DEPLOYED}/{name}"
        _refuse_a_real_folder(t, link)  # before anything is uploaded; `name` checks again, atomically
        t.check_trust(t.describe(Path(bundle)))  # a board that trusts keys: signed by one, or nothing goes up
        log(f"checking {profile.name} and uploading the bundle (cached by hash)")
        t.prepare(
            bundle, preflight=lambda facts, n: check_ready(manifest, facts, profile.name, [entry.name], 0, n)
        )
        cached = t.bundles[Path(bundle)]
        remote_wheel = f"{t.cache}/wheels/{wheel.sha256}/{wheel.name}"
        t.upload(wheel.data, remote_wheel, f"runtime wheel {wheel.name}")
        log(f"installing {wheel.name} into {t.python}'s venv (pip, offline)")
        _run(t, sh(t.python, "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall", "--quiet",
                   remote_wheel), "install the runtime wheel")  # fmt: skip
        named = t.board_command(sh(t.python, t.runner_path, "name", "--bundle", cached.remote,
                                   "--root", f"{home}/{DEPLOYED}", "--name", name, *cached.key_args()),
                                "verify and name the bundle")  # fmt: skip
        # -I: the venv's packages only, never a quarl_edge folder in the login directory
        out = _run(t, sh(t.python, "-I", "-c", CHECK, link, entry.name), "load and act with the runtime API")
        check = _answer(out, profile.name)
    python = t.python  # absolute (the profile's ~ is the board's $HOME), or a bare name on its PATH
    if check.get("torch_imported"):
        raise QuarlError(
            f"the runtime on {profile.name} imported torch", "report a bug: runtimes/ must not import torch"
        )
    if check.get("manifest_sha256") != cached.sha256 or check.get("sha256") != entry.sha256:
        raise QuarlError(f"load_policy on {profile.name} did not load the bundle just deployed",
                         f"run the deploy again; if it persists, check {link} on the board")  # fmt: skip
    was = named.get("was")
    return Deployed(profile.name, entry.name, link, python, check, cached.sha256,
                    was if isinstance(was, str) else None, warned)  # fmt: skip


def _refuse_a_real_folder(t: Any, link: str) -> None:
    q = shlex.quote(link)
    kind = _run(t, f"if [ -L {q} ]; then echo link; elif [ -e {q} ]; then echo real; else echo none; fi",
                "inspect the bundle's name").strip()  # fmt: skip
    if kind == "real":
        raise InputError(
            f"{t.profile.name}:{link} is a real file or folder, not a name deploy made; refused (nothing uploaded)",
            "move it away on the board, or deploy under another name with --name",
        )


def _answer(out: str, device: str) -> dict[str, Any]:
    try:
        check = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check = None
    if not isinstance(check, dict):
        raise QuarlError(f"the check on {device} printed no result", "run the deploy again with --debug")
    return check


def _run(t: Any, cmd: str, what: str) -> str:
    r = t.ssh.run(cmd, timeout=t.profile.command_timeout)
    if r.exit_status != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.exit_status}"])[-1]
        raise QuarlError(f"deploy to {t.profile.name} could not {what}: {tail[:300]}",
                         f"check the device with `quarl-edge devices check {t.profile.name}`, or set it up: quarl-edge devices setup {t.profile.name}")  # fmt: skip
    return str(r.stdout)


def tuned_elsewhere(tune: dict[str, Any] | None, device: str) -> str | None:
    """One line when a bundle `quarl-edge tune` made on one device goes to another (it still goes)."""
    tuned_on = (tune or {}).get("device")
    if not isinstance(tuned_on, str) or tuned_on == device:
        return None
    on = tuned_on[:64]
    return (f"this bundle was tuned on {on} and is deployed to {device}: its model choice and thread count "
            f"were measured on {on}; to choose for {device}: quarl-edge tune --policy POLICY --device {device} --out DIR")  # fmt: skip
