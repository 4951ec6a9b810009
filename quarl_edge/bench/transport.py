"""How a bench reaches its device: the Transport type, and the local one (a child process here).

A transport runs the device runner (``python -m quarl_edge.runtimes run``) with the given arguments and
yields its JSON-lines events. It may also have ``prepare(bundle, trace)`` (connect, upload),
``harness`` (its own timings) and ``device_facts`` (merged into the report's device). SSH:
quarl_edge.devices.remote.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.facts import device_info

Event = dict[str, Any]
# A transport runs the device runner with these arguments and yields its JSON-lines events.
Transport = Callable[[Path, list[str]], Iterator[Event]]


class LocalTransport:
    """Run the device runner as a child process of this Python, reading its JSON lines; the device's
    facts are this machine's (runtimes.facts, read once per process: the runner's interpreter is this one)."""

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

    @property
    def device_facts(self) -> dict[str, Any]:
        return dict(_local_facts())


@functools.cache
def _local_facts() -> dict[str, Any]:
    return device_info()


local_transport = LocalTransport()
