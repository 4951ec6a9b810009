"""A link to the policy on a device: the device runner's `serve` (runtimes/serve.py) over two line
streams, one observation out and one action back per step; over SSH (devices/remote.py) or as a child
process here. Used by `bench --env-on-host` (quarl_edge/bench/env_on_host.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.schema import Event
from quarl_edge.runtimes.serve import encode_obs


class PolicyLink:
    """The device's `serve` process over two line streams: one observation out, one action back."""

    def __init__(self, send: Callable[[str], None], readline: Callable[[], str], close: Callable[[], None],
                 where: str) -> None:  # fmt: skip
        self._send, self._readline, self._close, self.where = send, readline, close, where
        self.ready = self._next()
        if self.ready.get("event") != "ready":
            raise QuarlError(f"the policy server on {where} did not start ({str(self.ready)[:200]})",
                             "run again with --debug")  # fmt: skip

    def _next(self) -> Event:
        while True:
            line = self._readline()
            if not line:
                raise QuarlError(f"the policy server on {self.where} stopped", "run again with --debug")
            if line.lstrip().startswith("{"):
                msg: Event = json.loads(line)
                if msg.get("event") == "error":
                    raise QuarlError(f"on {self.where}: {msg.get('message', 'the policy server failed')}")
                return msg

    def act(self, obs: np.ndarray, discrete: bool) -> tuple[Any, float]:
        """The action for ``obs`` and the device's own inference time in us."""
        self._send(encode_obs(np.asarray(obs)) + "\n")
        msg = self._next()
        action = int(msg["action"]) if discrete else np.asarray(msg["action"], dtype=np.float32)
        return action, float(msg["act_us"])

    def close(self) -> None:
        self._close()


def local_link(bundle: Path, model: str, threads: int) -> PolicyLink:
    """`serve` as a child process here (the same protocol the SSH link speaks)."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    cmd = [sys.executable, "-m", "quarl_edge.runtimes", "serve", "--bundle", str(bundle), "--model", model,
           "--threads", str(threads)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def send(line: str) -> None:
        stdin.write(line)
        stdin.flush()

    def close() -> None:
        try:
            stdin.write("\n")
            stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    try:
        return PolicyLink(send, stdout.readline, close, "this machine")
    except BaseException:
        close()
        raise
