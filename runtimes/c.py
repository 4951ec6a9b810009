"""The ``c`` runtime adapter: a generated C policy (exporters/c.py) compiled into a shared object and
called through ctypes. Device side: the standard library, numpy and a C compiler.

Loading checks the C file first: it must be exactly what quarl-edge's generator writes for the program
it carries (runtimes/csource.py check_source), so a bundle can only ever make this machine compile the
fixed kernels with other numbers. The object is built once per (source, compiler, flags) into
``~/.cache/quarl-edge/c/<key>/`` (runtimes/ccompiler.py), never inside the bundle; a board without a
compiler can run an object cross-compiled on the host and named, with its sha256, in the manifest
(trusted as the bundle is: see docs/c.md).
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path
from typing import Any

import numpy as np

from . import ccompiler
from .adapters import register
from .cprogram import Program
from .csource import check_source, render_h
from .errors import InputError, IntegrityError, MissingDependencyError, QuarlError

MAX_C_BYTES = 256 << 20


def _features() -> dict[str, bool] | None:
    from .facts import hwcap_features, isa_features, parse_cpuinfo

    hw = hwcap_features()
    if hw is not None:
        return hw
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")[: 1 << 20]
    except OSError:
        return None
    return isa_features(parse_cpuinfo(text), platform.machine())


def read_c(path: Path) -> tuple[str, Program]:
    """The C file's text and its program, checked (see the module doc)."""
    try:
        size = path.stat().st_size
        if size > MAX_C_BYTES:
            raise IntegrityError(
                f"{path.name!r} is larger than {MAX_C_BYTES >> 20} MiB", "re-export the bundle"
            )
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise IntegrityError(f"{path.name!r} is not a UTF-8 C file", "re-export the bundle") from None
    except OSError as e:
        raise IntegrityError(f"cannot read {path.name!r} ({e.strerror})", "re-export the bundle") from None
    return text, check_source(text, repr(path.name))


PREBUILT_ENV = "QUARL_EDGE_C_PREBUILT"
"""``trust``: load a bundle's prebuilt shared object even when the bundle is not signed by a key this
machine trusts (the user's own decision: such an object is code that runs as it is)"""


def shared_object(text: str, program: Program, c_path: Path | None = None) -> tuple[Path, str]:
    """(the built object for this machine, what built it), compiling it on the first call; with no
    compiler, the object the bundle of ``c_path`` ships for this machine (see ``prebuilt``)."""
    compiler = ccompiler.find_compiler()
    if compiler is None:
        found = prebuilt(c_path, program) if c_path is not None else None
        if found is not None:
            return found
        raise MissingDependencyError(
            f"no C compiler on this machine to build the c-{program.precision} model, and its bundle has no "
            f"object built for {platform.machine()}",
            ccompiler.INSTALL,
        )
    machine = platform.machine()
    flags = compiler.flags(machine, _features())
    header = render_h(program)
    key = ccompiler.build_key(text, header, compiler, flags)
    out = ccompiler.cache_root() / key[:32] / "policy.so"
    if not out.is_file():
        ccompiler.compile_shared(text, header, program.header, compiler, flags, out)
    return out, f"{compiler.name}{' ' + ' '.join(flags) if flags else ''}"


def prebuilt(c_path: Path, program: Program) -> tuple[Path, str] | None:
    """The shared object the bundle ships for this machine (ModelFile role ``shared-object``), copied into
    our cache once its bytes match the manifest's sha256; None if the manifest names none. A prebuilt
    object cannot be checked like the source: it is loaded only from a bundle signed by a key this
    machine trusts (runtimes/signing.py), or with $QUARL_EDGE_C_PREBUILT=trust."""
    import hashlib
    import os

    from .bundlepath import read_file
    from .manifest import parse_manifest, read_manifest_bytes
    from .signing import check_signature

    bundle = c_path.parent
    data = read_manifest_bytes(bundle)
    entry = next((m for m in parse_manifest(data, bundle).models if m.file == c_path.name), None)
    machine = platform.machine()
    obj = next(
        (f for f in (entry.files if entry else ()) if f.role == "shared-object" and f.machine == machine),
        None,
    )
    if entry is None or obj is None:
        return None
    if os.environ.get(PREBUILT_ENV) != "trust":
        try:
            check_signature(bundle, data, required=True)
        except QuarlError as e:
            raise IntegrityError(
                f"{obj.file!r} is a prebuilt shared object (code that runs as it is), loaded only from a bundle "
                f"signed by a key this machine trusts: {e.problem}",
                f"sign the bundle (export --sign KEY) and trust the key here, install a C compiler to build "
                f"from the checked source, or set {PREBUILT_ENV}=trust",
            ) from None
    blob = read_file(bundle, obj.file, 1 << 30)
    digest = hashlib.sha256(blob).hexdigest()
    if digest != obj.sha256:
        raise IntegrityError(f"sha256 mismatch for {obj.file!r}: manifest {obj.sha256[:12]}, file {digest[:12]}",
                             "the file was modified or damaged; re-export the bundle")  # fmt: skip
    out = ccompiler.cache_root() / f"prebuilt-{digest[:32]}" / "policy.so"
    if not out.is_file():
        from .fsutil import atomic_write_bytes

        atomic_write_bytes(out, blob)
    return out, f"prebuilt {obj.built_by or machine}"


class CSession:
    format = "c"

    def __init__(self, path: Path, threads: int = 1, options: Any = None) -> None:
        text, program = read_c(path)
        so, self.built_by = shared_object(text, program, path)
        try:
            lib = ctypes.CDLL(str(so))
        except OSError as e:
            raise IntegrityError(
                f"the shared object built for {path.name!r} does not load ({str(e)[:160]})",
                f"remove {so.parent} and load again",
            ) from None
        self.program = program
        self.discrete = program.discrete
        self.obs_size = program.obs_size
        self.action_size = program.action_size
        self._batch = lib.qe_policy_act_batch
        self._batch.restype = None
        self._batch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self._one = lib.qe_policy_act
        if self.discrete:
            self._one.restype = ctypes.c_int
            self._one.argtypes = [ctypes.c_void_p]
        else:
            self._one.restype = None
            self._one.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._lib = lib  # the functions above keep it loaded; kept for clarity
        self._shape1 = (1, program.obs_size)
        self._x1 = np.zeros(self._shape1, np.float32)
        self._y1 = np.zeros((1, program.action_size), np.float32)
        self._a1 = np.zeros(1, np.int64)
        self._px1, self._py1 = self._x1.ctypes.data, self._y1.ctypes.data
        self.input_shape: tuple[int | None, ...] = (None, program.obs_size)
        self.input_dtype = np.dtype(np.float32)
        words = self.built_by.split()
        self.runtime = (
            f"c {'prebuilt:' + words[1] if words[0] == 'prebuilt' and len(words) > 1 else words[0]}"
        )
        self.threads = threads  # one thread: the C code is single-threaded by design

    def run_io(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The C program has one input and one output (exporters/c_onnx.py refuses any other graph): an
        action mask or a recurrent state cannot reach it."""
        if len(inputs) != 1:
            raise InputError(f"a c-* model takes the observation only, not {len(inputs)} inputs (masks, "
                             "recurrent state)", "run such a policy's onnx-* or tflite-* model")  # fmt: skip
        return [self.run(inputs[0])]

    def run(self, obs: np.ndarray) -> np.ndarray:
        if getattr(obs, "shape", None) == self._shape1:  # one observation: the control loop's call
            # into buffers made at load, passed by address: numpy's per-call pointer lookups cost more
            # than the policy itself (measured: __array_interface__ 2.2 us, the C call 0.9 us here)
            self._x1[...] = obs
            if self.discrete:
                self._a1[0] = self._one(self._px1)
                return self._a1.copy()
            self._one(self._px1, self._py1)
            return self._y1.copy()
        x = np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if x.shape[1] != self.obs_size:
            raise QuarlError(f"the C model takes {self.obs_size} values per observation, not {x.shape[1]}")
        n = len(x)
        if self.discrete:
            out = np.empty(n, np.intc)
            self._batch(x.ctypes.data, n, out.ctypes.data)
            return out.astype(np.int64)
        y = np.empty((n, self.action_size), np.float32)
        self._batch(x.ctypes.data, n, y.ctypes.data)
        return y


@register("c")
def _open(path: Path, threads: int, options: Any = None) -> CSession:
    return CSession(path, threads, options)
