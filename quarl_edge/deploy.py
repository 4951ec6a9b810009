"""`quarl-edge deploy --bundle B --device D [--model M]`: the runtime and the chosen model on the board.

Over the device's SSH link (strict host keys, key auth, every argument quoted): the pre-flight (a runtime
for the model's format there, disk), the bundle into the device's content-addressed cache (as a bench
uploads it: nothing again if it is there), the runtime-only wheel (devices/runtime_wheel.py, torch-free)
pip-installed offline into the profile's venv, a stable name for the bundle
(``~/.local/share/quarl-edge/bundles/NAME`` -> the cached copy), then a check on the board that
``load_policy`` loads it, acts on a zero observation and has not imported torch. Returns the lines to
use it there.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl_edge.devices.preflight import check_ready
from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.runtime_wheel import build_runtime_wheel
from quarl_edge.devices.ssh import sh
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.policy import choose_model

DEPLOYED = ".local/share/quarl-edge/bundles"
CHECK = """import json, sys
import numpy as np
from quarl_edge.runtimes import load_policy
p = load_policy(sys.argv[1], model=sys.argv[2])
a = p.act(p.zero_observation())
print(json.dumps({"model": p.info.model, "runtime": p.info.runtime, "action": np.asarray(a).tolist(),
                  "torch_imported": "torch" in sys.modules, "python": sys.executable}))
"""


@dataclass(frozen=True)
class Deployed:
    device: str
    model: str
    path: str
    """the bundle on the device (the stable name)"""
    python: str
    check: dict[str, Any]

    def usage(self) -> list[str]:
        return [f"on {self.device}: {self.python} -c \"from quarl_edge.runtimes import load_policy; "
                f"p = load_policy({self.path!r}, model={self.model!r}); p.reset(); print(p.act(p.make_env().reset(seed=0)[0]))\"",
                "docs: docs/runtime.md (load_policy, reset, act, info; examples/control_loop.py)"]  # fmt: skip


def deploy(bundle: Path, device: str, model: str | None = None, overrides: dict[str, Any] | None = None,
           log: Any = lambda _m: None) -> Deployed:  # fmt: skip
    from quarl_edge.devices.remote import SSHTransport

    profile = load_profile(device, overrides)
    if profile.transport != "ssh":
        raise InputError(f"device {device!r} is this machine: deploy puts the runtime on a board over SSH",
                         "pass --device NAME of a board (quarl-edge devices list); here: pip install quarl-edge")  # fmt: skip
    manifest = load_manifest(bundle)  # every hash, before anything goes to the board
    entry, _ = choose_model(manifest, model, bundle)
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in (manifest.policy.name or bundle.name))[
        :64
    ]
    wheel = build_runtime_wheel()
    with SSHTransport(profile) as t:
        log(f"checking {profile.name} and uploading the bundle (cached by hash)")
        t.prepare(
            bundle, preflight=lambda facts, n: check_ready(manifest, facts, profile.name, [entry.name], 0, n)
        )
        remote_bundle = t.bundles[Path(bundle)].remote
        remote_wheel = f"{t.cache}/wheels/{wheel.sha256}/{wheel.name}"
        t.upload(wheel.data, remote_wheel, f"runtime wheel {wheel.name}")
        log(f"installing {wheel.name} into {t.python}'s venv (pip, offline)")
        _run(t, sh(t.python, "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall", "--quiet",
                   remote_wheel), "install the runtime wheel")  # fmt: skip
        link, q = f"{DEPLOYED}/{name}", shlex.quote
        target = q(remote_bundle) if remote_bundle.startswith("/") else f'"$HOME"/{q(remote_bundle)}'
        _run(t, f"mkdir -p {q(DEPLOYED)} && ln -sfn {target} {q(link)}", "name the bundle")
        # -I: the venv's packages only, never a quarl_edge folder in the login directory
        out = _run(t, sh(t.python, "-I", "-c", CHECK, link, entry.name), "load and act with the runtime API")
        check = json.loads(out.strip().splitlines()[-1])
    if check.get("torch_imported"):
        raise QuarlError(
            f"the runtime on {profile.name} imported torch", "report a bug: runtimes/ must not import torch"
        )
    return Deployed(profile.name, entry.name, f"~/{link}", t.python, check)


def _run(t: Any, cmd: str, what: str) -> str:
    r = t.ssh.run(cmd, timeout=t.profile.command_timeout)
    if r.exit_status != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.exit_status}"])[-1]
        raise QuarlError(f"deploy to {t.profile.name} could not {what}: {tail[:300]}",
                         f"check the device with `quarl-edge devices check {t.profile.name}`, or set it up: quarl-edge devices setup {t.profile.name}")  # fmt: skip
    return str(r.stdout)
