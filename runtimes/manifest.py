"""Bundle manifest: the versioned JSON that describes every file of a bundle and its sha256.

A bundle is a folder: ``manifest.json``, one model file per variant, and optionally ``trace.npz``
(recorded observations for agreement checks and on-device replay).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import schema
from .artifact import MAX_JSON_BYTES, parse_artifact
from .bundlepath import entries, read_file, rel_path, safe_name, sha256_of
from .errors import InputError, IntegrityError
from .parity import SourceParity
from .schema import JSONObject
from .signing import SIGNATURE_NAME, check_signature
from .spec import PolicySpec
from .tunechoice import TuneChoice

MANIFEST_NAME = "manifest.json"
RESERVED = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
BUNDLE_FORMAT = "quarl-edge/bundle"
BUNDLE_VERSION = 1


FILE_ROLES = ("header", "shared-object")
MAX_MODEL_FILES = 16


@dataclass(frozen=True)
class ModelFile:
    """A file of a model beside its main one: a C model's header, a shared object prebuilt for a machine."""

    file: str
    role: str
    """``header`` or ``shared-object``"""
    sha256: str
    size_bytes: int
    machine: str | None = None
    """the machine a shared object runs on (``platform.machine()``: aarch64, x86_64, armv7l)"""
    built_by: str | None = None
    """the compiler and flags that built a shared object"""

    def to_dict(self) -> JSONObject:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, d: Any, fix: str) -> ModelFile:
        d = schema.obj(d, "model file entry", fix)
        role = schema.text(d["role"], "model file role", fix, 32)
        if role not in FILE_ROLES:
            raise InputError(f"model file role {role[:32]!r} is not one of {', '.join(FILE_ROLES)}", fix)
        machine = d.get("machine")
        return cls(
            file=_file(d["file"], "model file", fix),
            role=role,
            sha256=schema.text(d["sha256"], "model file sha256", fix, 64),
            size_bytes=schema.integer(d["size_bytes"], "model file size_bytes", fix, 0, 2**40),
            machine=None if machine is None else safe_name(machine, "model file machine", fix),
            built_by=None if d.get("built_by") is None else schema.text(d["built_by"], "built_by", fix, 200),
        )


@dataclass(frozen=True)
class TraceFile:
    """The bundle's recorded observations (``trace.npz``: agreement checks, on-device replay) and their
    sha256."""

    file: str
    sha256: str
    samples: int | None = None

    def to_dict(self) -> JSONObject:
        return {
            "file": self.file,
            "sha256": self.sha256,
            **({} if self.samples is None else {"samples": self.samples}),
        }

    @classmethod
    def from_dict(cls, d: Any, fix: str) -> TraceFile:
        d = schema.obj(d, "bundle manifest trace", fix)
        samples = d.get("samples")
        return cls(
            file=_file(d.get("file"), "bundle manifest trace.file", fix),
            sha256=schema.text(d.get("sha256"), "bundle manifest trace.sha256", fix, 64),
            samples=None
            if samples is None
            else schema.integer(samples, "bundle manifest trace.samples", fix, 0, 2**40),
        )


@dataclass(frozen=True)
class ModelEntry:
    name: str  # e.g. "onnx-int8"
    file: str
    format: str  # "onnx" | "tflite"
    precision: str  # "fp32" | "fp16" | "int8"
    sha256: str
    size_bytes: int
    quantization: dict[str, Any] = field(default_factory=dict)
    io: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    """converter / quantizer / runtime versions that made and read back the file"""
    files: tuple[ModelFile, ...] = ()
    """the model's other files (a C model's header, prebuilt shared objects), each hashed like the model"""

    def to_dict(self) -> JSONObject:
        return {
            "name": self.name,
            "file": self.file,
            "format": self.format,
            "precision": self.precision,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "quantization": self.quantization,
            "io": self.io,
            "toolchain": self.toolchain,
            **({"files": [f.to_dict() for f in self.files]} if self.files else {}),
        }


@dataclass(frozen=True)
class Manifest:
    policy: PolicySpec
    models: tuple[ModelEntry, ...]
    calibration: dict[str, Any] | None = None
    trace: TraceFile | None = None
    created: str = ""
    tool_version: str = ""
    tune: TuneChoice | None = None
    """set by `quarl-edge tune`: the chosen model, the device it was chosen for, the evidence"""
    source_parity: SourceParity | None = None
    """the fp32 models against the source policy on the trace (quarl_edge/parity.py), set at export"""

    def model(self, name: str) -> ModelEntry:
        for m in self.models:
            if m.name == name:
                return m
        raise InputError(
            f"bundle has no model {name!r}",
            f"models in this bundle: {', '.join(m.name for m in self.models)}",
        )

    def reference(self) -> ModelEntry | None:
        """The fp32 model the others are compared against (first fp32 model)."""
        return next((m for m in self.models if m.precision == "fp32"), None)

    def to_dict(self) -> JSONObject:
        return {
            "format": BUNDLE_FORMAT,
            "schema_version": BUNDLE_VERSION,
            "created": self.created,
            "tool_version": self.tool_version,
            "policy": self.policy.to_dict(),
            "calibration": self.calibration,
            "trace": None if self.trace is None else self.trace.to_dict(),
            "models": [m.to_dict() for m in self.models],
            **({"tune": self.tune.to_dict()} if self.tune is not None else {}),
            **({"source_parity": self.source_parity.to_dict()} if self.source_parity is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: JSONObject) -> Manifest:
        if d.get("format") != BUNDLE_FORMAT:
            raise InputError(
                "manifest.json is not a quarl-edge bundle manifest", "export one with `quarl-edge export`"
            )
        version = d.get("schema_version", 0)
        if isinstance(version, bool) or not isinstance(version, int):
            raise InputError(
                f"bundle manifest schema_version {version!r} is not an integer", "re-export the bundle"
            )
        if version > BUNDLE_VERSION:
            raise InputError("bundle manifest is newer than this quarl-edge", "upgrade quarl-edge")
        fix = "re-export the bundle"
        try:
            if not isinstance(d["models"], list) or len(d["models"]) > 256:
                raise InputError("bundle manifest models is not a list of at most 256", fix)
            if d.get("calibration") is not None:
                schema.obj(d["calibration"], "bundle manifest calibration", fix)
            trace = TraceFile.from_dict(d["trace"], fix) if d.get("trace") is not None else None
            models = tuple(
                ModelEntry(
                    # a model name is a runner argument and a file stem on the board: the safe alphabet
                    name=safe_name(m["name"], "model name", fix),
                    file=_file(m["file"], "model file", fix),
                    format=schema.text(m["format"], "model format", fix, 32),
                    precision=schema.text(m["precision"], "model precision", fix, 32),
                    sha256=schema.text(m["sha256"], "model sha256", fix, 64),
                    size_bytes=schema.integer(m["size_bytes"], "model size_bytes", fix, 0, 2**40),
                    quantization=dict(m.get("quantization") or {}),
                    io=dict(m.get("io") or {}),
                    toolchain={str(k): str(v) for k, v in (m.get("toolchain") or {}).items()},
                    files=_model_files(m.get("files"), fix),
                )
                for m in d["models"]
            )
            paths = [p for m in models for p in (m.file, *(f.file for f in m.files))]
            twice = next((p for p in paths if paths.count(p) > 1), None)
            if twice is not None:  # one file under two entries: a model's file could be another's header
                raise InputError(f"bundle manifest names the file {twice!r} twice", fix)
            names = [m.name for m in models]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:  # a model shadowed by a namesake would never be run or checked
                raise InputError(
                    f"bundle manifest names the model {twice!r} twice",
                    "re-export the bundle (names are unique)",
                )
            return cls(
                policy=PolicySpec.from_dict(d["policy"]),
                models=models,
                calibration=d.get("calibration"),
                trace=trace,
                created=str(d.get("created", "")),
                tool_version=str(d.get("tool_version", "")),
                tune=TuneChoice.from_dict(d["tune"]) if d.get("tune") is not None else None,
                source_parity=SourceParity.from_dict(d["source_parity"], "bundle manifest source_parity", fix)
                if d.get("source_parity") is not None
                else None,
            )
        except schema.MALFORMED as e:
            raise InputError(
                f"malformed bundle manifest (bad or missing field: {type(e).__name__}: {str(e)[:120]})", fix
            ) from None


def _model_files(v: Any, fix: str) -> tuple[ModelFile, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > MAX_MODEL_FILES:
        raise InputError(f"a model's files is not a list of at most {MAX_MODEL_FILES}", fix)
    return tuple(ModelFile.from_dict(f, fix) for f in v)


def _file(v: Any, what: str, fix: str) -> str:
    rel = rel_path(v, what, fix)
    if rel in RESERVED:
        raise InputError(f"{what} {rel!r} is the name of the bundle's own {rel}", fix)
    return rel


def _check_file(bundle: Path, rel: str, expected: str, what: str) -> Path:
    try:
        actual = sha256_of(bundle, rel)  # never through a link, at any segment
    except FileNotFoundError:
        raise IntegrityError(f"bundle file {rel!r} ({what}) is missing", "re-export the bundle") from None
    except OSError as e:  # a segment that is a file, a file we may not read
        raise IntegrityError(
            f"bundle file {rel!r} ({what}) cannot be read ({e.strerror or e})", "re-export the bundle"
        ) from None
    if actual != expected:
        raise IntegrityError(
            f"sha256 mismatch for {rel!r} ({what}): manifest {expected[:12]}, file {actual[:12]}",
            "the file was modified or damaged; re-export the bundle",
        )
    return bundle / rel


def read_manifest_bytes(bundle: str | Path) -> bytes:
    """``bundle/manifest.json``'s bytes, read without following a link."""
    bundle = Path(bundle)
    if not bundle.is_dir() or not (bundle / MANIFEST_NAME).exists():
        raise InputError(
            f"{str(bundle)!r} is not a bundle (no {MANIFEST_NAME})", "create one with `quarl-edge export`"
        )
    try:
        return read_file(bundle, MANIFEST_NAME, MAX_JSON_BYTES)
    except OSError as e:
        raise InputError(
            f"cannot read the bundle {str(bundle)!r} ({e.strerror or e})", "check its permissions"
        ) from None


def check_plain(bundle: Path) -> None:
    """Nothing in the bundle is a symlink (bundlepath.entries)."""
    try:
        entries(bundle)
    except OSError as e:
        raise InputError(
            f"cannot read the bundle {str(bundle)!r} ({e.strerror or e})", "check its permissions"
        ) from None


def parse_manifest(data: bytes, bundle: str | Path) -> Manifest:
    """The manifest of these exact bytes (read from ``bundle``), every field and path checked."""
    where = str(Path(bundle) / MANIFEST_NAME)
    doc = parse_artifact(data, where, BUNDLE_FORMAT, BUNDLE_VERSION, "bundle manifest", "re-export the bundle "
                         "with `quarl-edge export`", error=IntegrityError)  # fmt: skip
    return Manifest.from_dict(doc)


def load_manifest(bundle: str | Path, *, verify: bool = True, models: list[str] | None = None,
                  require_signature: bool = False) -> Manifest:  # fmt: skip
    """Read ``bundle/manifest.json`` and check the sha256 of every file it names (or of ``models``).

    Whatever ``verify`` says, every path the manifest names is a plain relative path, nothing in the
    bundle is a symlink (runtimes/bundlepath.py), and when ``require_signature`` or this machine
    trusts signing keys (runtimes/signing.py), manifest.sig is a trusted key's signature of the very
    bytes parsed here."""
    bundle = Path(bundle)
    data = read_manifest_bytes(bundle)
    manifest = parse_manifest(data, bundle)
    check_plain(bundle)
    check_signature(bundle, data, require_signature)
    if verify:
        verify_files(bundle, manifest, models)
    return manifest


def verify_files(bundle: Path, manifest: Manifest, models: list[str] | None = None) -> None:
    """Recompute the sha256 of every model (or of ``models``) and of the trace, from the files."""
    for m in manifest.models:
        if models is None or m.name in models:
            verify_model(bundle, m)
    if manifest.trace is not None:
        _check_file(bundle, manifest.trace.file, manifest.trace.sha256, "trace")


def bundle_files(manifest: Manifest) -> list[str]:
    """manifest.json and every file it names, each once, in a stable order."""
    files = [MANIFEST_NAME, *(p for m in manifest.models for p in (m.file, *(f.file for f in m.files)))]
    if manifest.trace is not None:
        files.append(manifest.trace.file)
    return list(dict.fromkeys(files))


def verify_model(bundle: str | Path, entry: ModelEntry) -> Path:
    """The model file's path, once its sha256 and those of the model's other files match the manifest's
    (IntegrityError otherwise)."""
    for f in entry.files:
        _check_file(Path(bundle), f.file, f.sha256, f"{entry.name} {f.role}")
    return _check_file(Path(bundle), entry.file, entry.sha256, entry.name)


def verify_model_file(bundle: str | Path, entry: ModelEntry, f: ModelFile) -> Path:
    """One of a model's other files, once its sha256 matches the manifest's."""
    return _check_file(Path(bundle), f.file, f.sha256, f"{entry.name} {f.role}")


def model_path(bundle: str | Path, entry: ModelEntry) -> Path:
    return Path(bundle) / entry.file
