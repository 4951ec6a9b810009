"""`devices check`: connect to a device, read its facts, and name what does not match its profile."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from quarl_edge.devices.profiles import DeviceProfile
from quarl_edge.devices.remote import LinkTimings, SSHTransport
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.facts import features_text
from quarl_edge.runtimes.schema import JSONObject


@dataclass(frozen=True)
class DeviceCheck:
    facts: JSONObject
    """what the device reported about itself (runtimes.facts' JSON)"""
    timings: LinkTimings | None = None
    """what reaching it cost (None: this machine)"""
    problems: tuple[str, ...] = ()

    def rows(self) -> list[list[str]]:
        f = self.facts
        rows = [[k, str(f.get(key) or "-") if key == "board" else str(f.get(key))]
                for k, key in (("machine", "machine"), ("cpu", "cpu_model"), ("board", "board"), ("cores", "cores"),
                               ("python", "python"), ("uname", "uname"))]  # fmt: skip
        src = f" (from {f['cpu_features_source']})" if f.get("cpu_features_source") else ""
        mem = f.get("mem_total_mb")
        emu = f.get("emulation") if isinstance(f.get("emulation"), dict) else None
        rows += [["int8 ISA", features_text(f.get("cpu_features")) + src],
                 ["governor", str(f.get("governor") or "not exposed")],
                 ["memory", f"{mem / 1024:.1f} GiB" if isinstance(mem, int | float) else "-"],
                 ["os", str(f.get("os") or "-")],
                 ["emulation", f"{emu.get('emulator')}, CPU model {emu.get('qemu_cpu') or 'qemu default'}" if emu else "no"]]  # fmt: skip
        rows += [[f"import {m}", v if v else "no"] for m, v in (f.get("runtimes") or {}).items()]
        providers = f.get("ort_providers")
        return rows + (
            [["ort providers", ", ".join(map(str, providers))]] if isinstance(providers, list) else []
        )


def local_facts() -> JSONObject:
    """The facts the local runner reports (`python -m quarl_edge.runtimes info`)."""
    r = subprocess.run(
        [sys.executable, "-m", "quarl_edge.runtimes", "info"], capture_output=True, text=True, timeout=300
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("{")), None)
    if r.returncode != 0 or line is None:
        raise QuarlError(
            f"the local runner does not start ({r.stderr.strip()[-200:]})", "reinstall quarl-edge"
        )
    data: JSONObject = json.loads(line)
    data.pop("event", None)
    return data


def check_device(p: DeviceProfile) -> DeviceCheck:
    """Connect (SSH, or this machine for `local`), read the facts, compare with the profile."""
    timings = None
    if p.transport == "local":
        facts = {"name": p.name, "transport": "local", "emulated": p.emulated, **local_facts()}
    else:
        with SSHTransport(p) as t:
            t.prepare()
            facts, timings = t.device_facts, t.timings
    problems = []
    if p.arch and facts.get("machine") != p.arch:
        problems.append(f"the profile says {p.arch}, the device is {facts.get('machine')}")
    if not (facts.get("runtimes") or {}).get(p.preferred_runtime):
        problems.append(f"the preferred runtime {p.preferred_runtime} does not import on the device")
    return DeviceCheck(facts, timings, tuple(problems))
