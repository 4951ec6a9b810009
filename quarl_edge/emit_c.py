"""`quarl-edge deploy --bundle B --emit c DIR`: a bundle's C model as a folder for a C/C++ control loop.

DIR gets the model's ``.c`` and ``.h`` (checked against the manifest and against the generator, as the
runtime checks them), a CMakeLists.txt, ``loop.c`` and ``loop.cpp`` (fixed-rate loops), the bundle's
trace observations as ``observations.f32`` with the Python runtime's actions for them
(``actions.txt``), a README and ``emit.json`` (what was written, with sha256s). DIR is written
atomically and replaced only when it is an earlier emit (quarl_edge.outputs).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

from quarl_edge import __version__
from quarl_edge.outputs import Kind, claim, json_format
from quarl_edge.runtimes.c import read_c
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_directory, atomic_write_json, sha256_file
from quarl_edge.runtimes.manifest import ModelEntry, load_manifest, verify_model
from quarl_edge.runtimes.trace import load_trace

EMIT_FORMAT = "quarl-edge/c-emit"
EMIT_VERSION = 1
MARKER = "emit.json"
TEMPLATES = ("CMakeLists.txt", "loop.c", "loop.cpp", "README.md")
ENTRIES = frozenset({*TEMPLATES, MARKER, "observations.f32", "actions.txt"})
EMIT = Kind("C deployment folder", True, lambda p: json_format(p / MARKER) == EMIT_FORMAT,
            lambda p: ENTRIES | {e.name for e in p.iterdir() if e.suffix in (".c", ".h")})  # fmt: skip


@dataclass(frozen=True)
class Emitted:
    out: Path
    model: str
    files: tuple[str, ...]
    observations: int

    def usage(self) -> list[str]:
        return [
            f"cmake -S {self.out} -B {self.out}/build && cmake --build {self.out}/build",
            f"{self.out}/build/loop_c --obs {self.out}/observations.f32 --steps {self.observations} --hz 0",
            f"see {self.out}/README.md (the API, CPU flags, SCHED_FIFO)",
        ]


def c_model(bundle: Path, model: str | None) -> ModelEntry:
    """The C model to emit: ``model``, else c-int8, else c-fp32 (InputError if the bundle has none)."""
    manifest = load_manifest(bundle, verify=False)
    c_models = [m for m in manifest.models if m.format == "c"]
    if model is not None:
        entry = manifest.model(model)
        if entry.format != "c":
            raise InputError(
                f"model {model!r} is {entry.format}, not C",
                f"C models of this bundle: {', '.join(m.name for m in c_models) or 'none'}",
            )
        return entry
    if not c_models:
        raise InputError(f"bundle {str(bundle)!r} has no C model",
                         "export one with `quarl-edge export --to c-int8` (or c-fp32)")  # fmt: skip
    return next((m for m in c_models if m.precision == "int8"), c_models[0])


def _fill(template: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        template = template.replace(f"@{k}@", v)
    return template


def emit_c(bundle: Path, out: Path, model: str | None = None, cpu_flags: str = "") -> Emitted:
    """Write the C deployment folder ``out`` for ``bundle``'s C model (see the module doc)."""
    bundle = Path(bundle)
    entry = c_model(bundle, model)
    claim(out, EMIT, [("bundle", bundle)], flag="--emit c")
    c_path = verify_model(bundle, entry)
    text, program = read_c(c_path)
    from quarl_edge.runtimes.csource import render_h
    from quarl_edge.runtimes.policy import Policy

    manifest = load_manifest(bundle, verify=False)
    trace = load_trace(bundle / manifest.trace.file) if manifest.trace is not None else None
    obs = np.zeros((0, program.obs_size), np.float32)
    actions: list[str] = []
    if trace is not None:
        obs = np.ascontiguousarray(trace.obs.reshape(len(trace.obs), -1), np.float32)
        if obs.shape[1] != program.obs_size or not np.all(np.isfinite(obs)):
            obs = obs[np.all(np.isfinite(obs), axis=1)] if obs.shape[1] == program.obs_size else obs[:0]
        policy = Policy(bundle, manifest, entry, 1)
        acts = policy.act_batch(obs) if len(obs) else np.zeros((0,))
        actions = [str(int(a)) if program.discrete else " ".join(format(float(v), ".9g") for v in np.atleast_1d(a))
                   for a in acts]  # fmt: skip
    api = (
        "int qe_policy_act(const float *obs);        /* the action index */"
        if program.discrete
        else "void qe_policy_act(const float *obs, float *action);"
    )
    values = {
        "NAME": program.name,
        "MODEL": entry.name,
        "HEADER": program.header,
        "C_FILE": c_path.name,
        "H_FILE": program.header,
        "SHA256": entry.sha256,
        "VERSION": __version__,
        "OBS_SIZE": str(program.obs_size),
        "OBS_ROWS": str(len(obs)),
        "API": api,
        "CPU_FLAGS": cpu_flags,
        "CPU_FLAGS_SHOWN": cpu_flags or "none (the compiler's baseline for its target)",
    }
    written: dict[str, str] = {}
    with atomic_directory(out) as tmp:
        (tmp / c_path.name).write_text(text)
        (tmp / program.header).write_text(render_h(program))
        for name in TEMPLATES:
            (tmp / name).write_text(
                _fill(files("quarl_edge").joinpath("assets", "c", name).read_text(), values)
            )
        (tmp / "observations.f32").write_bytes(obs.astype("<f4").tobytes())
        (tmp / "actions.txt").write_text("".join(a + "\n" for a in actions))
        for f in sorted(tmp.iterdir()):
            written[f.name] = sha256_file(f)
        atomic_write_json(tmp / MARKER, {
            "format": EMIT_FORMAT, "schema_version": EMIT_VERSION, "tool_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "bundle": str(bundle), "model": entry.name, "model_sha256": entry.sha256, "files": written,
        })  # fmt: skip
    return Emitted(out, entry.name, tuple(sorted([*written, MARKER])), len(obs))
