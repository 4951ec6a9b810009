"""tune's cache (``DIR/.cache/state.json``): every measurement, keyed by what it depends on, by content.

The key covers the policy (the files it was read from, an io.yaml among them, and its weights and spec as
loaded), the calibration file, the device's identity (profile, host, port, user and its facts: CPU,
cores, runtimes, ...), the versions of the tools that export and measure, and the search's settings. Each
measurement also names the sha256 of the model file it was made on (and of the reference, for a closed
loop), so a number is reused only for the very bytes it describes. What is read back is checked like any
input: an entry of the wrong type, an impossible number or another model's sha256 is measured again,
never reused and never fatal; one log line says so. The export settings of each candidate key the
candidates bundle (search.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quarl_edge import __version__
from quarl_edge.devices.profiles import DeviceProfile
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json, sha256_file
from quarl_edge.tune.records import Drift, Timing, nonnegative, share

STATE_FORMAT = "quarl-edge/tune-state"
STATE_VERSION = 3  # 3: content keys and a model sha256 per measurement; older caches are measured again
STAGES = ("layers", "screen", "latency", "closed", "confirm", "action_error")
TOOLS = ("onnx", "onnxruntime", "onnxscript", "torch", "litert-torch", "ai-edge-litert", "ai-edge-quantizer",
         "tflite-runtime", "tensorflow", "numpy", "gymnasium", "ale-py", "mujoco")  # fmt: skip
"""distributions whose version changes what is exported or measured on this host"""
DEVICE_FACTS = ("uname", "machine", "python", "cpu_model", "board", "cores", "runtimes", "cpu_features",
                "governor", "mem_total_mb", "os", "ort_providers", "emulation")  # fmt: skip
"""the facts that identify a device (not the free disk or which env packages it has)"""
_MAX_ENTRIES = 100_000
Log = Callable[[str], None]


def digest(*parts: Any) -> str:
    """sha256 of ``parts`` as canonical JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _policy_files(path: Path, vecnormalize: Path | None, io: Path | None = None) -> list[Path]:
    """The files a policy is read from: a checkpoint's policy.json and weights, an SB3 zip, an RL Zoo
    folder's zips and VecNormalize statistics, an ONNX graph or rsl_rl checkpoint, a --vecnormalize
    file, an --io io.yaml."""
    from quarl_edge.policy import format as checkpoint

    if path.is_dir():
        names = (checkpoint.META_FILE, checkpoint.WEIGHTS_FILE, "vec_normalize.pkl")
        files = sorted(p for p in path.iterdir() if p.is_file() and (p.name in names or p.suffix == ".zip"))
    else:
        files = [path]
    return files + [f for f in (vecnormalize, io) if f is not None]


def policy_sha256(path: Path, vecnormalize: Path | None, policy: Any, io: Path | None = None) -> str:
    """The policy by content: its files' bytes (the io.yaml's too), and what was loaded from them (spec,
    architecture and every weight and buffer, VecNormalize statistics included; for an imported ONNX
    graph, which is no torch module with weights, the graph as the importer normalized it), so neither
    a file swapped under the same name nor a loader change reuses another policy's measurements."""
    h = hashlib.sha256()
    for f in _policy_files(path, vecnormalize, io):
        h.update(f"{f.name}\0{sha256_file(f)}\0".encode())
    h.update(digest(policy.spec.to_dict(), asdict(policy.arch)).encode())
    source = getattr(policy, "source_model", None)
    if source is not None:
        h.update(b"source_model\0" + hashlib.sha256(source).hexdigest().encode())
    state_dict = getattr(policy.net, "state_dict", None)
    for name, t in sorted(state_dict().items() if callable(state_dict) else ()):
        a = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}\0{a.dtype}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def tool_versions() -> tuple[tuple[str, str], ...]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    return (("quarl-edge", __version__), *((d, version(d)) for d in TOOLS))


def device_sha256(profile: DeviceProfile, facts: dict[str, Any]) -> str:
    """The device's identity: where it is reached (a board at another address or port is another board,
    whatever its profile is called) and what it says it is."""
    where = {k: getattr(profile, k) for k in ("name", "transport", "host", "port", "user", "python",
                                                     "emulated")}  # fmt: skip
    return digest(where, {k: facts.get(k) for k in DEVICE_FACTS})


def _read_entry(stage: str, value: Any) -> Any:
    """A cached value of ``stage`` checked as it is read (InputError when it is not one)."""
    if stage in ("layers", "screen"):
        return share(value, stage)
    if stage == "latency":
        return Timing.from_dict(value, stage)
    if stage == "action_error":
        return nonnegative(value, stage)
    return Drift.from_dict(value, stage)


def _to_json(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


class State:
    """Every measurement of one tune, saved after each one (atomically), read back with checks."""

    def __init__(self, path: Path, key: str, inputs: dict[str, Any], log: Log) -> None:
        self.path, self.key, self.inputs, self.log = path, key, inputs, log
        self.data: dict[str, dict[str, Any]] = {s: {} for s in STAGES}
        self.hits: set[tuple[str, str]] = set()
        """entries of an earlier run that this one reused"""
        self.fresh: set[tuple[str, str]] = set()
        self._warned = False
        loaded = self._load()
        self.cached = sum(len(v) for v in loaded.values())
        self.data.update(loaded)

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        where = f"tune's cache {str(self.path)!r}"
        try:
            data = read_artifact(self.path, STATE_FORMAT, STATE_VERSION, "tune cache", "")
        except QuarlError as e:
            self.log(f"{where} is damaged or not readable ({e.problem[:160]}): everything is measured again")
            return {}
        if data.get("schema_version") != STATE_VERSION or data.get("key") != self.key:
            recorded = data.get("inputs")
            old: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
            changed = [k for k, v in self.inputs.items() if old.get(k) != v] or ["the search's settings"]
            self.log(f"{where} was made for other inputs ({', '.join(changed)} changed): measuring again")
            return {}
        out = {}
        for stage in STAGES:
            entries = data.get(stage)
            if isinstance(entries, dict) and len(entries) <= _MAX_ENTRIES:
                out[stage] = {str(k): v for k, v in entries.items()}
            elif entries is not None:
                self._damaged(f"{stage} is not a table of measurements")
        return out

    def _damaged(self, what: str) -> None:
        if not self._warned:  # one line for the whole cache: the first damaged entry names the problem
            self.log(f"tune's cache {str(self.path)!r} has damaged or stale entries (first: {what}): "
                     "they are measured again")  # fmt: skip
            self._warned = True

    def get(self, stage: str, name: str, model: str) -> Any:
        """The value measured for ``name`` on the model(s) ``model`` identifies (their sha256s), if it is
        cached and sound; else None (and it is measured again)."""
        entry = self.data[stage].get(name)
        if entry is None:
            return None
        try:
            if not isinstance(entry, dict) or entry.get("model") != model:
                raise QuarlError(
                    "measured on other model bytes" if isinstance(entry, dict) else "not an entry"
                )
            value = _read_entry(stage, entry.get("value"))
        except (QuarlError, *schema.MALFORMED) as e:
            why = e.problem if isinstance(e, QuarlError) else f"{type(e).__name__}: {e}"
            self._damaged(f"{stage} {name[:80]!r}: {why[:120]}")
            del self.data[stage][name]
            return None
        if (stage, name) not in self.fresh:
            self.hits.add((stage, name))
        return value

    def put(self, stage: str, name: str, model: str, value: Any) -> Any:
        self.data[stage][name] = {"model": model, "value": _to_json(value)}
        self.fresh.add((stage, name))
        atomic_write_json(self.path, {"format": STATE_FORMAT, "schema_version": STATE_VERSION, "key": self.key,
                                      "inputs": self.inputs, **self.data})  # fmt: skip
        return value

    @property
    def reused(self) -> int:
        return len(self.hits)
