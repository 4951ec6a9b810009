"""A bench on a named device: its profile, its transport (local or SSH), the partial file, the report.

The one library call behind `quarl-edge bench` (and anything else that benches on a device profile).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from quarl_edge.bench.partial import PARTIAL_FORMAT, partial_path
from quarl_edge.bench.report import REPORT, REPORT_MARKDOWN, write_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import Event, Transport, local_transport
from quarl_edge.devices.profiles import DeviceProfile, load_profile
from quarl_edge.outputs import Kind, claim, json_format
from quarl_edge.runtimes.errors import InputError, Interrupted, QuarlError
from quarl_edge.runtimes.manifest import load_manifest

PARTIAL = Kind("partial bench file", False, lambda p: json_format(p) == PARTIAL_FORMAT)


def transport_for(profile: DeviceProfile) -> Transport:
    """The function that runs the device runner for this profile (a Transport of quarl_edge.bench.run)."""
    if profile.transport == "local":
        return local_transport
    from quarl_edge.devices.remote import SSHTransport

    return SSHTransport(profile)  # type: ignore[return-value]


def device_stub(profile: DeviceProfile) -> dict[str, Any]:
    """The report's ``device`` before the device adds its own facts (bench.run.bench merges them in)."""
    return {"name": profile.name, "transport": profile.transport, "emulated": profile.emulated}


def model_count(bundle: Path, cfg: BenchConfig) -> int:
    """How many models the bench will run (for a progress bar): --models and the fp32 reference."""
    manifest = load_manifest(bundle, verify=False)  # bench() verifies the hashes
    ref = manifest.reference()
    return len(set(cfg.models) | {ref.name} if cfg.models and ref else manifest.models)


def check_out(out: Path | None, resume: bool, bundle: Path | None = None, trace: Path | None = None) -> None:
    """The report's path, its Markdown and partial file beside it: each absent or ours (outputs.claim),
    none of them in the bundle or the trace this bench reads."""
    if out is not None and out.suffix != ".json":
        raise InputError(f"--out {str(out)!r} must end in .json", "e.g. --out reports/policy.json")
    if resume and out is None:
        raise InputError(
            "--resume needs the --out of the interrupted bench", "e.g. --out reports/policy.json --resume"
        )
    if out is None:
        return
    reads = [("bundle", bundle), ("trace", trace)]
    claim(out, REPORT, reads)
    md, partial = out.with_suffix(".md"), partial_path(out)
    claim(md, REPORT_MARKDOWN, reads, name=f"the report's Markdown {str(md)!r} (beside --out)")
    claim(partial, PARTIAL, reads, name=f"the partial results file {str(partial)!r} (beside --out)")


def unwritable(e: QuarlError | OSError, what: str, kept: str, out: Path) -> InputError:
    """The one line for a finished bench whose report could not be written (its results are kept)."""
    why = e.problem if isinstance(e, QuarlError) else f"{e.strerror or e}"
    return InputError(
        f"{what} could not be written ({why}); {kept}",
        f"free --out {str(out)!r} (or fix its folder) and run the same command with --resume: it "
        "writes the report without measuring again",
    )


def _write(report: dict[str, Any], out: Path, bundle: Path, trace: Path | None) -> None:
    """Write the report, then remove the partial file: never the other way round."""
    partial = partial_path(out)
    try:
        check_out(out, False, bundle, trace)  # again: the bench took a while, the path may have changed
        write_report(report, out)
    except (QuarlError, OSError) as e:
        kept = f"every result is kept in {str(partial)!r}"
        raise unwritable(e, "the bench finished but its report", kept, out) from e
    partial.unlink(missing_ok=True)


def bench_on_device(
    bundle: Path,
    cfg: BenchConfig,
    device: str = "local",
    overrides: dict[str, Any] | None = None,
    out: Path | None = None,
    resume: bool = False,
    progress: Callable[[Event], None] | None = None,
    log: Callable[[str], None] = lambda _msg: None,
    threads_given: bool = True,
) -> dict[str, Any]:
    """Bench ``bundle`` on the device profile ``device``; write the report to ``out`` when given.

    ``threads_given=False``: the bench runs with the profile's default thread count instead of cfg's.
    """
    profile = load_profile(device, overrides)
    check_out(out, resume, bundle, cfg.trace)
    if not threads_given:
        cfg = replace(cfg, threads=profile.default_threads)
    partial = partial_path(out) if out is not None else None
    if partial is not None and partial.is_file() and not resume:
        log(f"starting over: {partial} (from an interrupted bench) is replaced; --resume would continue it")
    transport = transport_for(profile)
    try:
        report = bench(bundle, cfg, device=device_stub(profile), transport=transport, progress=progress,
                       partial=partial, resume=resume)  # fmt: skip
    except KeyboardInterrupt:
        if partial is not None and partial.is_file():
            raise Interrupted(f"interrupted; finished episodes are kept in {partial}",
                              "run the same bench command with --resume to finish only the rest") from None  # fmt: skip
        raise Interrupted("interrupted; nothing was kept", "pass --out to keep finished results") from None
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    if out is not None:
        _write(report, out, bundle, cfg.trace)
    return report
