"""How a bench reaches its device: the Transport protocol, and the transports registered by name (a
device profile's ``transport``): ``local`` (a child process here) and ``ssh`` (devices/remote.py).

A transport runs the device runner (``python -m quarl_edge.runtimes run``) with the given arguments and
yields its JSON-lines events; ``prepare`` connects and uploads what the device lacks (checking the bench
fits the board first), ``device_facts`` is what the device reports about itself (merged into the report's
device), ``timings`` its own overhead (the report's harness), ``policy_link`` the policy alone for
``--env-on-host``, ``close`` ends its connection.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from quarl_edge.devices.link import PolicyLink, local_link
from quarl_edge.devices.profiles import DeviceProfile
from quarl_edge.devices.remote import LinkTimings, Preflight, SSHTransport
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.facts import device_info
from quarl_edge.runtimes.schema import Event, JSONObject


class Transport(Protocol):
    name: str
    """its registered name, the report's harness.transport"""

    def __call__(self, bundle: Path, args: list[str]) -> Iterator[Event]:
        """Run the device runner on ``bundle`` with ``args``; its events, as they come."""
        ...

    def prepare(self, bundle: Path | None = None, trace: Path | None = None,
                preflight: Preflight | None = None) -> None:  # fmt: skip
        """Ready the device for ``bundle`` and ``trace``; ``preflight(facts, bytes_to_upload)`` may refuse."""
        ...

    @property
    def device_facts(self) -> JSONObject:
        """What the device reported about itself (runtimes.facts; data, never trusted as anything else)."""
        ...

    @property
    def timings(self) -> LinkTimings | None:
        """The transport's own overhead so far (None: nothing between here and the device)."""
        ...

    def policy_link(self, bundle: Path, model: str, threads: int) -> PolicyLink: ...

    def close(self) -> None: ...


class LocalTransport:
    """Run the device runner as a child process of this Python, reading its JSON lines; the device's
    facts are this machine's (runtimes.facts, read once per process: the runner's interpreter is this one)."""

    name = "local"
    timings: LinkTimings | None = None

    def __call__(self, bundle: Path, args: list[str]) -> Iterator[Event]:
        env = dict(os.environ, PYTHONSAFEPATH="1")  # never import from the caller's cwd
        cmd = [sys.executable, "-m", "quarl_edge.runtimes", "run", "--bundle", str(bundle), *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                yield json.loads(line)
        err = proc.stderr.read()
        if proc.wait() not in (0, 2):
            tail = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
            raise QuarlError(f"the runner crashed: {tail}", "run again with --debug, or report a bug")

    def prepare(self, bundle: Path | None = None, trace: Path | None = None,
                preflight: Preflight | None = None) -> None:  # fmt: skip
        """Nothing to upload: the bundle is here, and the bench checks its own machine as it runs."""

    @property
    def device_facts(self) -> JSONObject:
        return _local_facts()

    def policy_link(self, bundle: Path, model: str, threads: int) -> PolicyLink:
        return local_link(bundle, model, threads)

    def close(self) -> None:
        pass


@functools.cache
def _local_facts() -> JSONObject:
    return device_info()


local_transport = LocalTransport()

TRANSPORTS: dict[str, Callable[[DeviceProfile], Transport]] = {
    "local": lambda _profile: local_transport,
    "ssh": SSHTransport,
}
"""by the name a device profile gives (devices/profiles.py TRANSPORTS lists the same names: a profile is
checked when it is read, below this floor)"""


def transport_for(profile: DeviceProfile) -> Transport:
    """The transport that reaches ``profile``'s device; an unknown name lists the known ones."""
    make = TRANSPORTS.get(profile.transport)
    if make is None:
        raise InputError(f"device {profile.name!r}: unknown transport {profile.transport!r}",
                         f"known transports: {', '.join(TRANSPORTS)}")  # fmt: skip
    return make(profile)
