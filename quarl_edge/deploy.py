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
import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from quarl_edge.devices.preflight import check_ready
from quarl_edge.devices.profiles import ProfileOverrides, load_profile
from quarl_edge.devices.runtime_wheel import build_runtime_wheel
from quarl_edge.devices.ssh import sh
from quarl_edge.runtimes.bundlepath import safe_name
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.selection import choose_model
from quarl_edge.runtimes.tunechoice import TuneChoice
from quarl_edge.typed import build, flag, text

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


SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class BoardCheck:
    """What CHECK printed on the board: the model ``load_policy`` loaded there, from which manifest, its
    first action, and whether torch was imported (it must not be)."""

    model: str
    runtime: str
    action: object
    """the action for a zero observation, as JSON: a number, or a (nested) list of numbers"""
    manifest_sha256: str
    sha256: str
    torch_imported: bool
    python: str

    def __post_init__(self) -> None:
        for name in ("model", "runtime", "python"):
            text(getattr(self, name), name)
        for name in ("manifest_sha256", "sha256"):
            value = getattr(self, name)
            if not isinstance(value, str) or not SHA256.match(value):
                raise ValueError(f"{name} is not a sha256 ({str(value)[:40]!r})")
        _action(self.action, "action")
        flag(self.torch_imported, "torch_imported")

    def to_dict(self) -> JSONObject:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def parse(cls, out: str, device: str) -> BoardCheck:
        """The check's last line of output; a QuarlError naming ``device`` when it is not one."""
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict):
            raise QuarlError(f"the check on {device} printed no result", "run the deploy again with --debug")
        try:
            return build(cls, answer, "the check's result", {"action": _action})
        except ValueError as e:
            raise QuarlError(f"the check on {device} printed a malformed result ({e})",
                             "run the deploy again with --debug") from None  # fmt: skip


def _action(v: object, name: str, depth: int = 0) -> object:
    """An action as JSON holds it (kept as it is, for the report): a number or a list of them, nested."""
    if isinstance(v, list | tuple) and depth < 8:
        for i, x in enumerate(v):
            _action(x, f"{name}[{i}]", depth + 1)
    elif isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{name} is not a number or a list of numbers ({str(v)[:40]!r})")
    return v


@dataclass(frozen=True)
class Deployed:
    device: str
    model: str
    path: str
    """the bundle's stable name on the device, an absolute path"""
    python: str
    check: BoardCheck
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
        check = BoardCheck.parse(out, profile.name)
    python = t.python  # absolute (the profile's ~ is the board's $HOME), or a bare name on its PATH
    if check.torch_imported:
        raise QuarlError(
            f"the runtime on {profile.name} imported torch", "report a bug: runtimes/ must not import torch"
        )
    if check.manifest_sha256 != cached.sha256 or check.sha256 != entry.sha256:
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


def _run(t: Any, cmd: str, what: str) -> str:
    r = t.ssh.run(cmd, timeout=t.profile.command_timeout)
    if r.exit_status != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.exit_status}"])[-1]
        raise QuarlError(f"deploy to {t.profile.name} could not {what}: {tail[:300]}",
                         f"check the device with `quarl-edge devices check {t.profile.name}`, or set it up: quarl-edge devices setup {t.profile.name}")  # fmt: skip
    return str(r.stdout)


def tuned_elsewhere(tune: TuneChoice | None, device: str) -> str | None:
    """One line when a bundle `quarl-edge tune` made on one device goes to another (it still goes)."""
    if tune is None or tune.device == device:
        return None
    on = tune.device[:64]
    return (f"this bundle was tuned on {on} and is deployed to {device}: its model choice and thread count "
            f"were measured on {on}; to choose for {device}: quarl-edge tune --policy POLICY --device {device} --out DIR")  # fmt: skip
