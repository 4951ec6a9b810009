"""tune ships what it measured. ``DIR/bundle`` is made of the chosen model's file and its fp32 reference,
copied byte for byte from the candidates bundle the measurements were made on (each copy's sha256 checked
against the sha256 recorded with those measurements), never exported again. The choice is then benched
there once more against fp32 on every seed its verdict used, and ``DIR/tune.json`` is that bench report
(so `quarl-edge gate` reads it) plus the ``tune`` block, which names the sha256 of every model whose
numbers it reports and of the shipped bundle's manifest; ``tune.md`` and ``tune.png`` follow."""

from __future__ import annotations

import datetime as _dt
import shutil
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from quarl_edge import __version__
from quarl_edge.bench.report import REPORT
from quarl_edge.bench.result import Device
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import Transport
from quarl_edge.outputs import BUNDLE, claim
from quarl_edge.runtimes.errors import IntegrityError, QuarlError
from quarl_edge.runtimes.fsutil import (
    atomic_directory,
    atomic_write_json,
    atomic_write_text,
    finite_json,
    sha256_file,
)
from quarl_edge.runtimes.manifest import MANIFEST_NAME, Manifest, load_manifest
from quarl_edge.runtimes.signer import sign_bundle
from quarl_edge.runtimes.tunechoice import TuneChoice
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.records import Shipped
from quarl_edge.tune.report import TUNE_MARKDOWN, markdown, plot
from quarl_edge.tune.result import TuneResult

SHIPPED = "bundle"
"""the shipped bundle's name in --out (tune.json's ``shipped.path``)"""


class NothingPasses(QuarlError):
    """No candidate passes the gate: exit 1 (like a failed gate), the closest ones named."""

    exit_code = 1


def _copy(src: Path, dst: Path, rel: str, sha: str, what: str) -> None:
    """``src/rel`` copied to ``dst/rel``; the copy's sha256 must be ``sha`` (IntegrityError otherwise)."""
    p = PurePosixPath(rel)
    if len(p.parts) != 1 or p.name.startswith(".") or "\\" in rel or (src / rel).is_symlink():
        # one plain file name, as our exporters write it
        raise IntegrityError(f"the candidates bundle names {what} by an unexpected path {rel[:80]!r}",
                             "run tune again (its cache is checked and re-exported)")  # fmt: skip
    shutil.copyfile(src / rel, dst / rel)
    got = sha256_file(dst / rel)
    if got != sha:
        raise IntegrityError(f"{what} in the candidates bundle is not the file that was measured "
                             f"(sha256 {got[:12]}, measured {sha[:12]})",
                             "run tune again: the changed file is measured again")  # fmt: skip


def copy_measured(src: Path, dst: Path, measured: dict[str, str], tune: TuneChoice,
                  sign_key: Path | None = None) -> Manifest:  # fmt: skip
    """A bundle in ``dst`` holding the models ``measured`` names ({name: sha256 measured}) copied from the
    bundle ``src``, its trace, and a manifest whose sha256s are those measured; signed with ``sign_key``
    (before it is read back or benched: a machine that requires signatures refuses it unsigned)."""
    m = load_manifest(src, verify=False)  # every copy is hashed below, after it is made
    entries = [m.model(name) for name in measured]
    for e in entries:
        if e.sha256 != measured[e.name]:
            raise IntegrityError(f"the candidates bundle's {e.name} is not the model that was measured "
                                 f"(manifest {e.sha256[:12]}, measured {measured[e.name][:12]})",
                                 "run tune again: the changed model is measured again")  # fmt: skip
        _copy(src, dst, e.file, e.sha256, e.name)
        for f in e.files:  # a C model's header and prebuilt objects, hashed in the same manifest entry
            _copy(src, dst, f.file, f.sha256, f"{e.name}'s {f.role}")
    if m.trace is not None:
        _copy(src, dst, m.trace.file, m.trace.sha256, "the replay trace")
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    shipped = Manifest(policy=m.policy, models=tuple(entries), calibration=m.calibration, trace=m.trace,
                       created=created, tool_version=__version__, tune=tune)  # fmt: skip
    atomic_write_json(dst / MANIFEST_NAME, shipped.to_dict())
    if sign_key is not None:
        sign_bundle(dst, sign_key)
    load_manifest(dst)  # reads back as a bundle whose every sha256 matches
    return shipped


def write_outputs(result: TuneResult, cfg: TuneConfig, device: Device, transport: Transport) -> TuneResult:
    """The shipped bundle, its bench against fp32, tune.json/.md/.png; the result naming them."""
    out = cfg.out
    c = result.choice
    if c is None:
        offline = result.reward_not_measured is not None
        judged = sorted((r for r in result.candidates if (r.action_error if offline else r.drop_pct) is not None),
                        key=lambda r: (r.action_error if offline else r.drop_pct) or 0.0)  # fmt: skip
        closest = "; ".join(f"{r.name}: {r.why}" for r in judged[:3]) or "no candidate was judged"
        raise NothingPasses(f"no candidate passes the gate (closest: {closest})",
                            f"loosen {'--max-action-error' if offline else '--max-reward-drop'} / --max-p99-ms, "
                            "or give a larger --budget-min")  # fmt: skip
    files = [claim(out / "tune.json", REPORT), claim(out / "tune.md", TUNE_MARKDOWN, name="tune.md"),
             out / "tune.png", claim(out / SHIPPED, BUNDLE, name="the tuned bundle")]  # fmt: skip
    names = [result.reference] + ([c.name] if c.name != result.reference else [])
    measured = {n: result.row(n).sha256 for n in names}
    tune = TuneChoice(c.name, c.threads, device.name, device.emulated, c.to_dict(), result.inputs.policy_sha256,
                      tuple(measured.items()))  # fmt: skip
    # the first seeds and a close call's fresh ones follow on; no episodes where the env cannot run here
    episodes = 0 if result.reward_not_measured else c.episodes or cfg.episodes
    with atomic_directory(files[3]) as tmp:
        copy_measured(Path(result.bundle), tmp, measured, tune, cfg.sign_key)
        report = bench(tmp, BenchConfig(episodes=episodes, seed=cfg.seed, threads=c.threads,
                                        latency_samples=cfg.latency_samples, models=tuple(names[1:])),
                       device=device, transport=transport).to_dict()  # fmt: skip
        claim(
            files[3], BUNDLE, name="the tuned bundle"
        )  # again, just before the swap: the bench took a while
    shipped = Shipped(SHIPPED, sha256_file(files[3] / MANIFEST_NAME), tuple(measured.items()))
    final = replace(result, shipped=shipped, files=tuple(str(f) for f in files))
    atomic_write_json(files[0], finite_json(tune_json(report, final, files[3])))
    atomic_write_text(files[1], markdown(final))
    plot(final, files[2])
    return final


def tune_json(report: dict[str, Any], result: TuneResult, bundle: Path) -> dict[str, Any]:
    """The bench report of the shipped bundle (made in its temporary folder, the same bytes) under the
    bundle's final path, with the tune block."""
    return {**report, "bundle": {**report["bundle"], "path": str(bundle)}, "tune": result.tune_block()}
