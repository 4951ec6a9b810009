"""A bench on devices (`quarl-edge bench --device rpi4` or `--device rpi4,rpi5,lab-pi`): every device at once,
on the same seeds, episodes and trace, into one report (bench/fleet_result.py). One device is a fleet of
one: the same path, its report written as that device's own (bench/report.py), its bench run in this
thread (so Ctrl-C reaches it directly).

In this order:

1. Every input is checked before anything connects (check_fleet): each name a known profile, none
   twice, no per-device SSH flag for two devices or more (--host/--user/--port/--identity would apply to
   every device), the bundle and its models (bench.run.plan), the report, its Markdown and one partial
   file per device beside --out (``r.json`` -> ``r.partial.json`` for one device, ``fleet.json`` ->
   ``fleet.<device>.partial.json`` for a fleet), each absent or ours (outputs.claim).
2. Every device's pre-flight, at once: a board connects and its facts are checked against the bundle
   before any upload (devices/preflight.py); `local` checks its runtimes and makes the env here. No
   device measures until every one has passed: the first to fail stops the fleet with its one-line fix,
   naming it, and nothing is written.
3. One thread per device benches it through its own transport (bench.run.bench), keeping its finished
   work in its own partial file as it arrives.

A device that fails part-way (a dropped link) does not stop the others. The report then holds the
finished devices' sections and, under ``failed``, each device that did not finish with its error and
its partial file; every partial file is kept (the finished devices' too: --resume measures nothing again
there) and the command exits 2. A fleet of one that fails writes no report: its error is the bench's
own. ``--resume`` continues each device from its own partial file. The partial files are removed once
the whole fleet has finished and its report is on disk.
"""

from __future__ import annotations

import datetime as _dt
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from quarl_edge import __version__
from quarl_edge.bench.device import PARTIAL, device_stub, unwritable
from quarl_edge.bench.fleet_result import Failure, FleetReport, FleetSettings
from quarl_edge.bench.partial import PartialBench, partial_path
from quarl_edge.bench.report import REPORT, REPORT_MARKDOWN, write_report
from quarl_edge.bench.result import BenchReport
from quarl_edge.bench.run import BenchConfig, bench, board_preflight, bundle_info, partial_key, plan
from quarl_edge.bench.transport import Event, Transport, transport_for
from quarl_edge.devices.preflight import check_host_ready
from quarl_edge.devices.profiles import DeviceProfile, ProfileOverrides, load_profile
from quarl_edge.outputs import claim
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import InputError, Interrupted, QuarlError
from quarl_edge.runtimes.manifest import Manifest
from quarl_edge.runtimes.schema import JSONObject

SSH_FLAGS = ("host", "user", "port", "identity")
STOP_GRACE_S = 5.0
"""after Ctrl-C, how long the devices' threads get to save what they finished"""


class FleetIncomplete(QuarlError):
    """One or more devices did not finish; the others' results are in the report."""


@dataclass(frozen=True)
class FleetRequest:
    bundle: Path
    devices: tuple[str, ...]
    """device profile names, in the report's order"""
    cfg: BenchConfig
    """the same on every device (seeds, episodes, trace, models)"""
    threads_given: bool = True
    """False: each device runs at its profile's default_threads instead of cfg.threads"""
    out: Path | None = None
    resume: bool = False


@dataclass(frozen=True)
class FleetResult:
    report: FleetReport
    """also with the devices that did not finish"""
    errors: dict[str, QuarlError]
    """per device that did not finish, why"""

    def error(self, out: Path | None) -> FleetIncomplete | None:
        """The one line for a fleet that did not finish everywhere (None: it did)."""
        if not self.errors:
            return None
        done = [d for d, _ in self.report.sections]
        why = "; ".join(f"{dev} did not finish: {e.problem}" for dev, e in self.errors.items())
        if done:
            why += f" ({', '.join(done)} finished" + (f", in {out})" if out is not None else ")")
        if out is None:
            return FleetIncomplete(why, "pass --out to keep finished results, and run the fleet again")
        return FleetIncomplete(why, "run the same command with --resume to finish only the rest")


def parse_devices(text: str) -> tuple[str, ...]:
    """'rpi4,rpi5' -> ('rpi4', 'rpi5'); an empty name or a name given twice is an InputError."""
    names = tuple(x.strip() for x in text.split(","))
    example = "e.g. --device local,rpi4"
    if not all(names):
        raise InputError(
            f"--device {text!r} has an empty name", f"separate device names by commas, {example}"
        )
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise InputError(f"--device {text!r} names {twice!r} twice", f"list each device once, {example}")
    return names


def partial_file(out: Path, device: str) -> Path:
    """``reports/fleet.json`` -> ``reports/fleet.<device>.partial.json`` (a device name is a simple name)."""
    return out.with_name(f"{out.stem}.{device}.partial.json")


def _partial(req: FleetRequest, device: str) -> Path | None:
    """Where a device keeps its finished work: beside --out, ``r.partial.json`` for one device."""
    if req.out is None:
        return None
    return partial_path(req.out) if len(req.devices) == 1 else partial_file(req.out, device)


def check_fleet(req: FleetRequest, overrides: ProfileOverrides | None = None) -> list[DeviceProfile]:
    """Every check that needs no device, before any work: the names, the flags, the output files."""
    given = [k for k in SSH_FLAGS if getattr(overrides, k, None) is not None]
    listed = ",".join(req.devices)
    if given and len(req.devices) > 1:
        raise InputError(
            f"--{given[0]} would apply to every device of --device {listed}",
            f"set it in each device's profile (e.g. [{req.devices[-1]}] {given[0]} = ... in "
            "~/.config/quarl-edge/devices.toml), or bench one device with it",
        )
    parse_devices(listed)  # a library caller's list gets the CLI's checks
    profiles = [load_profile(d, overrides if len(req.devices) == 1 else None) for d in req.devices]
    check_outputs(req)
    return profiles


def check_outputs(req: FleetRequest) -> None:
    """The report, its Markdown and every partial file: each absent or ours, none of them in the bundle
    or the trace the bench reads."""
    out, one = req.out, len(req.devices) == 1
    example = "reports/policy.json" if one else "reports/fleet.json"
    if out is not None and out.suffix != ".json":
        raise InputError(f"--out {str(out)!r} must end in .json", f"e.g. --out {example}")
    if req.resume and out is None:
        raise InputError(
            "--resume needs the --out of the interrupted bench", f"e.g. --out {example} --resume"
        )
    if out is None:
        return
    reads = [("bundle", req.bundle), ("trace", req.cfg.trace)]
    claim(out, REPORT, reads)
    md = out.with_suffix(".md")
    claim(md, REPORT_MARKDOWN, reads, name=f"the report's Markdown {str(md)!r} (beside --out)")
    for d in req.devices:
        p, of = (partial_path(out), "") if one else (partial_file(out, d), f" of {d}")
        claim(p, PARTIAL, reads, name=f"the partial results file{of} {str(p)!r} (beside --out)")


@dataclass
class _Member:
    """One device of the fleet while it runs (written by its own thread only)."""

    profile: DeviceProfile
    cfg: BenchConfig
    partial: Path | None
    resume: bool
    transport: Transport
    report: BenchReport | None = None
    error: BaseException | None = None
    stage: str = "pre-flight"
    """where it stopped: pre-flight (nothing measured anywhere) or bench"""
    stopped: bool = False
    """stopped in its pre-flight because another device failed its own"""


@dataclass(frozen=True)
class _Fleet:
    req: FleetRequest
    manifest: Manifest
    names: list[str]
    ready: threading.Barrier
    """every device's pre-flight has passed: only then does any device measure"""
    stop: threading.Event
    progress: Callable[[str, Event], None] | None


def bench_fleet(
    req: FleetRequest,
    overrides: ProfileOverrides | None = None,
    progress: Callable[[str, Event], None] | None = None,
    log: Callable[[str], None] = lambda _msg: None,
) -> FleetResult:
    """Bench ``req.bundle`` on every device of ``req.devices`` at once; write the report to ``req.out``
    when given. ``progress(device, event)`` is called from the devices' threads (one device: this one).
    ``overrides``: profile fields for a single device (--host, --port, ...)."""
    profiles = check_fleet(req, overrides)
    manifest, names, ref = plan(req.bundle, req.cfg)
    members = [_member(req, p) for p in profiles]
    _check_resume(req, members, names, log)
    if req.cfg.env_on_host and req.cfg.seeds:
        make_env(manifest.policy.env).close()  # every device's env runs here: a missing package stops it now
    fleet = _Fleet(req, manifest, names, threading.Barrier(len(members)), threading.Event(), progress)
    if len(members) == 1:
        _bench_one(members[0], fleet)
    else:
        _bench_many(members, fleet)
    failed_first = next((m for m in members if m.stage == "pre-flight" and m.error and not m.stopped), None)
    if failed_first is not None:
        raise _preflight_error(failed_first, len(members))
    if len(members) == 1 and members[0].error is not None:
        raise members[0].error  # one device: its own error (its finished work is in its partial file)
    sections = {m.profile.name: m.report for m in members if m.report is not None}
    report = FleetReport(
        devices=tuple(req.devices), reports=sections,
        failed={m.profile.name: _failure(m) for m in members if m.report is None},
        bundle=bundle_info(req.bundle, manifest), settings=_settings(req.cfg, names, members), reference=ref.name,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), tool_version=__version__,
    )  # fmt: skip
    if req.out is not None:
        _write(report, req.out, req, members)
    bug = next(
        (m.error for m in members if m.error is not None and not isinstance(m.error, QuarlError)), None
    )
    if bug is not None:  # not a user's problem: shown as it is (--debug: with its traceback)
        raise bug
    errors = {m.profile.name: m.error for m in members if isinstance(m.error, QuarlError)}
    return FleetResult(report, errors)


def _bench_one(m: _Member, fleet: _Fleet) -> None:
    """One device, in this thread: Ctrl-C stops its bench where it is, with what finished kept."""
    try:
        _run(m, fleet)
    except KeyboardInterrupt:
        raise _interrupted([m]) from None


def _bench_many(members: list[_Member], fleet: _Fleet) -> None:
    """A thread per device; Ctrl-C stops each at its next event, with what finished kept."""
    threads = [threading.Thread(target=_run, args=(m, fleet), name=f"quarl-edge-fleet-{m.profile.name}",
                                daemon=True) for m in members]  # fmt: skip
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        fleet.stop.set()
        fleet.ready.abort()
        for t in threads:
            t.join(STOP_GRACE_S / len(threads))
        raise _interrupted(members) from None


def _settings(cfg: BenchConfig, names: list[str], members: list[_Member]) -> FleetSettings:
    """The fleet report's ``settings``: what every device shared, and each one's threads."""
    return FleetSettings(episodes=cfg.episodes, seeds=tuple(cfg.seeds), models=tuple(names),
                         threads={m.profile.name: m.cfg.threads for m in members}, latency_samples=cfg.latency_samples,
                         warmup=cfg.warmup, max_steps=cfg.max_steps, hz=cfg.hz, duration_s=cfg.duration_s,
                         env_on_host=cfg.env_on_host, trace=None if cfg.trace is None else str(cfg.trace))  # fmt: skip


def _member(req: FleetRequest, profile: DeviceProfile) -> _Member:
    cfg = req.cfg if req.threads_given else replace(req.cfg, threads=profile.default_threads)
    partial = _partial(req, profile.name)
    # a transport is made here, in one thread: a missing SSH client library stops the fleet before any work
    return _Member(profile, cfg, partial, req.resume, transport_for(profile))


def _check_resume(
    req: FleetRequest, members: list[_Member], names: list[str], log: Callable[[str], None]
) -> None:
    """--resume: each device with a partial file continues it (checked now: same bundle, seeds, flags),
    a device without one starts afresh; without --resume a partial file left by an earlier run is replaced."""
    kept = [m for m in members if m.partial is not None and m.partial.is_file()]
    if not req.resume:
        for m in kept:
            log(
                f"starting over: {m.partial} (from an interrupted bench) is replaced; --resume would continue it"
            )
        return
    if not kept and len(members) == 1:
        raise InputError(f"nothing to resume: {str(members[0].partial)!r} does not exist",
                         "run the bench without --resume")  # fmt: skip
    if not kept:
        raise InputError(
            f"nothing to resume: none of {', '.join(repr(str(m.partial)) for m in members)} exists",
            "run the fleet bench without --resume",
        )
    for m in members:
        m.resume = m in kept
        if m.resume and m.partial is not None:
            key = partial_key(req.bundle, m.cfg, names, m.profile.name)
            PartialBench.resume(m.partial, key, names, m.cfg.seeds)  # reads only: a mismatch is refused now


def _run(m: _Member, fleet: _Fleet) -> None:
    """One device's thread: its pre-flight, then its bench; every outcome is kept in ``m``."""
    name = m.profile.name

    def on_event(ev: Event) -> None:
        if fleet.stop.is_set():  # Ctrl-C: stop at the next event, with what finished kept
            raise QuarlError(f"{name} stopped: the fleet bench was interrupted")
        if fleet.progress is not None:
            fleet.progress(name, ev)

    try:
        try:
            _preflight(m, fleet)
        except threading.BrokenBarrierError:
            m.stopped = True
            return
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            fleet.ready.abort()  # the others stop at once, before measuring
            m.error = e
            return
        m.stage = "bench"
        m.report = bench(fleet.req.bundle, m.cfg, device=device_stub(m.profile), transport=m.transport,
                         progress=on_event, partial=m.partial, resume=m.resume)  # fmt: skip
    except KeyboardInterrupt:  # one device benched in the main thread: the caller says what was kept
        raise
    except BaseException as e:
        m.error = e
    finally:
        m.transport.close()


def _preflight(m: _Member, fleet: _Fleet) -> None:
    """The device's pre-flight, then wait until every device has passed its own."""
    if m.profile.transport == "local":  # this machine: the runner is a child process of this Python
        check_host_ready(fleet.manifest, fleet.names, len(m.cfg.seeds), m.profile.name)
        fleet.ready.wait()
        return
    board = board_preflight(fleet.manifest, m.cfg, fleet.names, m.profile.name)

    def check_then_wait(facts: JSONObject, upload_bytes: int) -> None:
        board(facts, upload_bytes)
        fleet.ready.wait()  # before the upload: a board that fails stops the others' uploads too

    m.transport.prepare(fleet.req.bundle, m.cfg.trace, preflight=check_then_wait)


def _preflight_error(m: _Member, devices: int) -> BaseException:
    e = m.error
    if not isinstance(e, QuarlError):
        return e or QuarlError("pre-flight failed")
    if devices == 1:
        return e
    name = m.profile.name
    problem = e.problem if name in e.problem else f"{name}: {e.problem}"
    if "nothing was measured" not in problem:
        problem += "; the fleet stopped before any device measured"
    return type(e)(problem, e.fix) if type(e).__init__ is QuarlError.__init__ else QuarlError(problem, e.fix)


def _failure(m: _Member) -> Failure:
    e = m.error
    return Failure(
        error=(e.problem if isinstance(e, QuarlError) else f"{type(e).__name__}: {e}") or "failed",
        fix=e.fix if isinstance(e, QuarlError) else None,
        partial=str(m.partial) if m.partial is not None and m.partial.is_file() else None,
    )


def _write(report: FleetReport, out: Path, req: FleetRequest, members: list[_Member]) -> None:
    """Write the report, then (when every device finished) remove the partial files: never the other way."""
    try:
        check_outputs(replace(req, resume=False))  # again: the bench took a while, the paths may have changed
        write_report(report, out)
    except (QuarlError, OSError) as e:
        if len(members) == 1:
            raise unwritable(
                e,
                "the bench finished but its report",
                f"every result is kept in {str(members[0].partial)!r}",
                out,
            ) from e
        kept = f"every device's results are kept in its partial file beside it ({partial_file(out, '<device>').name})"
        raise unwritable(e, "the fleet's report", kept, out) from e
    if report.complete:
        for m in members:
            if m.partial is not None:
                m.partial.unlink(missing_ok=True)


def _interrupted(members: list[_Member]) -> Interrupted:
    kept = [str(m.partial) for m in members if m.partial is not None and m.partial.is_file()]
    if kept:
        return Interrupted(f"interrupted; finished episodes are kept in {', '.join(kept)}",
                           "run the same bench command with --resume to finish only the rest")  # fmt: skip
    return Interrupted("interrupted; nothing was kept", "pass --out to keep finished results")


def bench_on_device(
    bundle: Path,
    cfg: BenchConfig,
    device: str = "local",
    overrides: ProfileOverrides | None = None,
    out: Path | None = None,
    resume: bool = False,
    progress: Callable[[Event], None] | None = None,
    log: Callable[[str], None] = lambda _msg: None,
    threads_given: bool = True,
) -> BenchReport:
    """Bench ``bundle`` on the device profile ``device`` (a fleet of one); write
    the report to ``out`` when given. ``threads_given=False``: the profile's default thread count."""
    req = FleetRequest(bundle, (device,), cfg, threads_given, out, resume)
    on_event = None if progress is None else (lambda _dev, ev: progress(ev))
    return bench_fleet(req, overrides, progress=on_event, log=log).report.reports[device]
