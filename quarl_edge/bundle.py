"""Write a bundle: the exported models, a replay trace and manifest.json with every file's sha256."""

from __future__ import annotations

import contextlib
import datetime as _dt
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from quarl_edge import __version__, interrupts
from quarl_edge.exporters.base import (
    EXPORTERS,
    NEEDS_CALIBRATION,
    ExportConfig,
    ExportContext,
    GraphCache,
)
from quarl_edge.exporters.targets import resolve_targets
from quarl_edge.field.calibration import calibration_trace
from quarl_edge.outputs import BUNDLE, claim
from quarl_edge.parity import source_parity
from quarl_edge.policy.net import Policy
from quarl_edge.quant.deployable import deployable
from quarl_edge.record import RecordConfig, check_trace_fits, record
from quarl_edge.runtimes.envs import split_wrappers
from quarl_edge.runtimes.errors import InputError, Interrupted
from quarl_edge.runtimes.fsutil import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    clean_temp_dirs,
    sha256_file,
    temp_dir_prefix,
)
from quarl_edge.runtimes.inputs import calibration_range
from quarl_edge.runtimes.manifest import MANIFEST_NAME, Manifest, ModelEntry, ModelFile, TraceFile
from quarl_edge.runtimes.signing import SIGNATURE_NAME, load_private_key, signature_document
from quarl_edge.runtimes.trace import Trace, save_trace
from quarl_edge.runtimes.tunechoice import TuneChoice

TRACE_SAMPLES = 1000
WORK_PREFIX = "quarl-export"
"""the exporters' scratch folders in the system temp folder: quarl-export-PID-XXXXXXXX"""
_EXT = {"onnx": "onnx", "tflite": "tflite"}


@dataclass(frozen=True)
class Variant:
    """One model of a bundle under a name of its own: an export target with its own settings (tune's
    candidates: several int8 models differing in calibration or float layers, side by side)."""

    name: str
    target: str
    config: ExportConfig


@dataclass(frozen=True)
class BundleRequest:
    out: Path
    targets: tuple[str, ...] = ("onnx-fp32", "onnx-fp16", "onnx-int8")
    """exporters/targets.py names; `export --to`'s default"""
    calibration: Path | None = None
    """recorded rollouts (.npz) or a field log folder (load_policy(..., log_dir=...): what a robot saw)"""
    more_calibration: tuple[Path, ...] = ()
    """more of either, merged after ``calibration`` into one calibration set (quarl_edge.field.calibration)"""
    config: ExportConfig = ExportConfig()
    record_episodes: int = 10
    """episodes recorded on the fly when no calibration file is given"""
    variants: tuple[Variant, ...] = ()
    """more models, each under its own name, after ``targets`` (which are named by their target)"""
    tune: TuneChoice | None = None
    """recorded in the manifest: the choice `quarl-edge tune` made for this bundle, with its evidence"""
    reads: Sequence[tuple[str, Path | None]] = ()
    """what else the export reads, as (label, path): the policy's folder or .zip, a VecNormalize file.
    ``out`` may not be, hold or lie inside any of them (nor the calibration file)"""
    sign_key: Path | None = None
    """an ed25519 private key: the bundle gets a manifest.sig (runtimes/signing.py) before it appears"""
    graphs: GraphCache | None = None
    """fp32 graphs this policy object was exported to before, unchanged since (:func:`graph_cache`); None:
    the bundle's own"""

    def inputs(self) -> list[tuple[str, Path | None]]:
        sources = [("field log" if p.is_dir() else "calibration file", p) for p in self.calibration_sources()]
        return [*sources, *self.reads]

    def calibration_sources(self) -> list[Path]:
        return [] if self.calibration is None else [self.calibration, *self.more_calibration]


def _calibration(policy: Policy, req: BundleRequest, log: Callable[[str], None]) -> Trace:
    sources = req.calibration_sources()
    if sources:  # recorded rollouts, observations a robot logged (no env here), field log folders
        trace = calibration_trace(sources)  # a single .npz is read as it always was: load_observations
        check_trace_fits(trace, policy, ", ".join(map(str, sources)))
        return trace
    if req.more_calibration:
        raise InputError("more calibration data was given without the first", "pass it as calibration")
    log(f"no calibration file given: recording {req.record_episodes} episodes for calibration")
    return record(policy, RecordConfig(episodes=req.record_episodes, epsilon=0.1, seed=0, max_samples=5000))


@contextlib.contextmanager
def graph_cache() -> Iterator[GraphCache]:
    """A GraphCache for several bundles of one policy object (in a scratch folder removed after)."""
    with tempfile.TemporaryDirectory(prefix=temp_dir_prefix(WORK_PREFIX)) as folder:
        yield GraphCache(Path(folder))


def export_bundle(
    policy: Policy, req: BundleRequest, log: Callable[[str], None] = lambda _m: None
) -> Manifest:
    """Export ``policy`` into the bundle folder ``req.out`` (replaced as a whole, atomically, when it is
    a bundle already; anything else there is refused first: quarl_edge.outputs)."""
    try:
        return _export_bundle(policy, req, log)
    except KeyboardInterrupt:  # the bundle is written atomically: nothing half-written is left
        raise Interrupted(
            f"interrupted; {str(req.out)!r} was left as it was", "run the export again"
        ) from None


def _jobs(req: BundleRequest) -> list[Variant]:
    jobs = [Variant(t, t, req.config) for t in resolve_targets(list(req.targets))] if req.targets else []
    if req.variants:
        resolve_targets([v.target for v in req.variants])
    jobs += list(req.variants)
    names = [j.name for j in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None or not jobs:
        raise InputError(f"model name {twice!r} given twice" if twice else "no models to export",
                         "give every model its own name")  # fmt: skip
    return jobs


def _export_bundle(policy: Policy, req: BundleRequest, log: Callable[[str], None]) -> Manifest:
    jobs = _jobs(req)  # cheap validation before any expensive step
    key = load_private_key(req.sign_key) if req.sign_key is not None else None
    targets = [j.target for j in jobs]
    claim(req.out, BUNDLE, req.inputs())
    clean_temp_dirs(WORK_PREFIX)  # what SIGKILLed exports left in /tmp
    calib = _calibration(policy, req, log)
    idx = calib.subsample_index(req.config.max_calibration_samples, seed=1)
    calib_obs = calib.obs[idx]
    # a recurrent policy's state at every calibration step: the torch policy run over the recorded episodes
    calib_state = tuple(s[idx] for s in policy.run_sequence(calib.obs, calib.action_masks, calib.episode_starts())[1]) \
        if policy.arch.recurrent else ()  # fmt: skip
    if calib_obs.dtype.kind == "f":  # NaN/inf rows would poison the calibrated ranges
        finite = np.all(np.isfinite(calib_obs.reshape(len(calib_obs), -1)), axis=1)
        calib_obs, calib_state = calib_obs[finite], tuple(s[finite] for s in calib_state)
    if len(calib_obs) == 0 and any(t in NEEDS_CALIBRATION for t in targets):
        raise InputError(
            "the calibration data has no finite observations", "record it again with `quarl-edge record`"
        )
    # a QAT policy is resolved once into a plain policy + learned ranges; exporters never see training code
    resolved = deployable(policy) if policy.arch.qat else None
    qat_fields = (
        {"qat": resolved.qat, "plain": resolved.plain, "learned_ranges": resolved.ranges} if resolved else {}
    )
    entries: list[ModelEntry] = []
    work_dir = tempfile.TemporaryDirectory(prefix=temp_dir_prefix(WORK_PREFIX))
    with work_dir as work, atomic_directory(req.out) as tmp:
        graphs = req.graphs if req.graphs is not None else GraphCache(Path(work))
        for job in jobs:
            fmt, precision = job.target.rsplit("-", 1)
            ctx = ExportContext(
                policy=policy,
                calibration=calib_obs[: job.config.max_calibration_samples]
                if job.target in NEEDS_CALIBRATION
                else None,
                calibration_state=tuple(s[: job.config.max_calibration_samples] for s in calib_state),
                config=job.config,
                workdir=Path(work),
                graphs=graphs,
                **qat_fields,  # type: ignore[arg-type]
            )
            stem = precision if job.name == job.target else job.name
            file = tmp / f"policy.{stem}.{_EXT.get(fmt, fmt)}"
            out = EXPORTERS[job.target](ctx, file)
            name = job.name
            entries.append(
                ModelEntry(
                    name=name,
                    file=out.file.name,
                    format=out.format,
                    precision=out.precision,
                    sha256=sha256_file(out.file),
                    size_bytes=out.file.stat().st_size,
                    quantization=out.quantization,
                    io=out.io,
                    toolchain=out.toolchain,
                    files=tuple(
                        ModelFile(
                            f.path.name,
                            f.role,
                            sha256_file(f.path),
                            f.path.stat().st_size,
                            f.machine,
                            f.built_by,
                        )
                        for f in out.files
                    ),
                )
            )
        # a recurrent policy replays whole episodes in order; others any spread of steps
        trace = calib.head(TRACE_SAMPLES) if policy.spec.state else calib.subsample(TRACE_SAMPLES, seed=2)
        save_trace(trace, tmp / "trace.npz")
        calibration = {
            "file": str(req.calibration) if req.calibration else None,
            "recorded_on_the_fly": req.calibration is None,
            **({"sources": calib.meta["merged"]} if "merged" in calib.meta else {}),
            **({"source": calib.meta["source"]} if "source" in calib.meta else {}),
            "sha256": calib.sha256,
            "samples": calib.samples,
            "samples_used": int(len(calib_obs)),
            "episodes": calib.episodes,
            "env_id": calib.meta.get("env_id"),
        }
        # per feature of the env's observation: what the runtime's out-of-range monitoring compares against
        obs_range = calibration_range(calib_obs, stack_dims=len(split_wrappers(policy.spec.env)[1]))
        if obs_range is not None:
            calibration["range"] = obs_range
        manifest = Manifest(
            policy=policy.spec,
            models=tuple(entries),
            calibration=calibration,
            trace=TraceFile("trace.npz", sha256_file(tmp / "trace.npz"), trace.samples),
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            tool_version=__version__,
            tune=req.tune,
        )
        atomic_write_json(tmp / MANIFEST_NAME, manifest.to_dict())
        fp32 = [e.name for e in entries if e.precision == "fp32"]
        if fp32:  # measured on the written models, as a bench will load them
            parity = source_parity(policy, tmp, manifest, trace, fp32)
            log(parity.line())
            manifest = replace(manifest, source_parity=parity)
            atomic_write_json(tmp / MANIFEST_NAME, manifest.to_dict())
        if key is not None:  # over the bytes just written, inside the folder that is renamed into place
            atomic_write_bytes(
                tmp / SIGNATURE_NAME, signature_document((tmp / MANIFEST_NAME).read_bytes(), key)
            )
        claim(req.out, BUNDLE, req.inputs())  # again, just before the swap: the export took a while
        interrupts.check()  # a Ctrl-C that a converter caught and dropped still stops the swap
    return manifest
