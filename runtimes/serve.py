"""`python -m quarl_edge.runtimes serve --bundle B --model M [--threads T]`: the policy alone, for a host
that runs the environment itself (`bench --env-on-host`, for an env whose packages the board cannot
install, e.g. box2d on aarch64).

JSON lines both ways. The device first says ``{"event": "ready", ...}``; then for each request
``{"obs": BASE64, "dtype": "float32", "shape": [8]}`` (the raw bytes of the observation the policy sees,
after the env's wrappers, which run on the host) it answers ``{"action": ..., "act_us": T}`` with
``act_us`` the inference alone, timed on the device, so the host can tell policy time from link time.
An empty line or the end of input ends it.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .runner import PolicyRunner

OBS_DTYPES = frozenset({"float32", "float64", "uint8", "int8", "int32", "int64", "bool"})
MAX_OBS_BYTES = 1 << 24  # 16 MiB: far above any policy's observation, far below a board's memory


def decode_obs(req: Any) -> np.ndarray:
    """The observation of one request, checked: a bad request is data, never code or a crash."""
    if not isinstance(req, dict) or not isinstance(req.get("obs"), str):
        raise InputError("a serve request is not {'obs': base64, 'dtype', 'shape'}", "send what bench sends")
    dtype, shape = req.get("dtype"), req.get("shape")
    if dtype not in OBS_DTYPES:
        raise InputError(
            f"observation dtype {str(dtype)[:20]!r} is not one of {sorted(OBS_DTYPES)}",
            "send a numeric array",
        )
    if (
        not isinstance(shape, list)
        or len(shape) > 8
        or not all(isinstance(d, int) and 0 <= d < 1 << 20 for d in shape)
    ):
        raise InputError("observation shape is not a list of up to 8 sizes", "send the array's shape")
    if len(req["obs"]) > MAX_OBS_BYTES * 4 // 3 + 4:
        raise InputError("observation is larger than 16 MiB", "send one observation per request")
    try:
        return np.frombuffer(base64.b64decode(req["obs"], validate=True), dtype=dtype).reshape(shape)
    except ValueError as e:
        raise InputError(
            f"observation bytes do not match dtype and shape ({e})", "send the array's own bytes"
        ) from None


def encode_obs(obs: np.ndarray) -> str:
    """The request line for one observation (the host side of the protocol)."""
    a = np.ascontiguousarray(obs)
    return json.dumps(
        {"obs": base64.b64encode(a.tobytes()).decode(), "dtype": a.dtype.name, "shape": list(a.shape)}
    )


def serve(
    bundle: str | Path, model: str, threads: int, lines: Iterable[str], emit: Callable[[dict[str, Any]], None]
) -> int:
    """Answer each request line with the action; returns the number answered."""
    runner = PolicyRunner(bundle, model, threads)
    emit({"event": "ready", "model": model, "load_ms": runner.load_ns / 1e6})
    answered = 0
    for line in lines:
        line = line.strip()
        if not line:
            break
        try:
            req = json.loads(line)
        except ValueError:
            raise InputError("a serve request is not JSON", "send one JSON object per line") from None
        obs = decode_obs(req)
        t0 = time.perf_counter_ns()
        action = runner.act(obs)
        act_us = (time.perf_counter_ns() - t0) / 1000.0
        emit({"action": action.tolist() if isinstance(action, np.ndarray) else action, "act_us": act_us})
        answered += 1
    return answered
