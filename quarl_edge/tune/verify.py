"""Reading tune.json back (`quarl-edge gate`, and anything else that trusts it): a bench report with a
``tune`` block. Beyond the report's own checks (bench/report.py), the block is read as a typed TuneResult
(every number in its range, the choice a candidate that passed, its sha256 the one measured) and held
against the report it sits in: the choice and the reference are models the report benched, the report's
bundle holds the policy the tune block names and is the shipped bundle (same manifest sha256). When the
shipped bundle sits beside tune.json, as tune wrote it, its files must be the ones tune.json names.
Any mismatch is one InputError (exit 2): gate never certifies what tune did not measure."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from quarl_edge.bench.fleet_result import FLEET_FORMAT, FLEET_VERSION
from quarl_edge.bench.report import REPORT_FORMAT, REPORT_VERSION
from quarl_edge.outputs import json_format
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import MANIFEST_NAME, load_manifest
from quarl_edge.tune.records import FIX
from quarl_edge.tune.result import TuneResult


def read_tune_json(path: str | Path) -> TuneResult | None:
    """tune.json's tune block, checked against its report (read typed with `bench.report.read_report`);
    None for a bench report without one."""
    path = Path(path)
    if json_format(path) == FLEET_FORMAT:  # tune writes one device's report; a fleet carries no tune block
        fleet = read_artifact(path, FLEET_FORMAT, FLEET_VERSION, "bench report", "re-run `quarl-edge bench`")
        sections = fleet.get("reports")
        if isinstance(sections, dict) and any(isinstance(r, dict) and "tune" in r for r in sections.values()):
            raise InputError(f"{str(path)!r} is a fleet report carrying a tune block, which tune never writes",
                             "gate the tune.json that `quarl-edge tune` wrote")  # fmt: skip
        return None
    data = read_artifact(path, REPORT_FORMAT, REPORT_VERSION, "bench report", "re-run `quarl-edge bench`")
    if "tune" not in data:
        return None
    where = f"tune.json {str(path)!r}"
    result = TuneResult.from_dict(data["tune"], f"{where}'s tune block")
    try:
        check_against_report(result, data, where)
    except schema.MALFORMED as e:
        raise InputError(f"malformed {where} ({type(e).__name__}: {str(e)[:120]})", FIX) from None
    check_shipped_bundle(result, path.parent, where)
    return result


def check_tune_json(path: str | Path) -> None:
    """What `quarl-edge gate` calls on every report it reads: nothing for a plain bench report."""
    read_tune_json(path)


def check_against_report(result: TuneResult, report: dict[str, Any], where: str) -> None:
    c = result.choice
    if c is None or result.shipped is None:
        raise InputError(
            f"{where} has no choice or no shipped bundle: tune writes tune.json only for a choice", FIX
        )
    benched = [m.get("name") for m in report["models"] if isinstance(m, dict)]
    for name, what in ((result.reference, "its fp32 reference"), (c.name, "its choice")):
        if name not in benched:
            raise InputError(f"{where}: {what} {name[:80]!r} was never benched in it (benched: "
                             f"{', '.join(map(str, benched))[:200]})", FIX)  # fmt: skip
    if bool(report.get("reward_not_measured")) != (result.reward_not_measured is not None):
        said = "was not" if result.reward_not_measured else "was"
        raise InputError(
            f"{where}: its tune block says the reward {said} measured, its report says otherwise", FIX
        )
    if report.get("reference") != result.reference:
        raise InputError(f"{where}: the report's reference is not the tune block's {result.reference!r}", FIX)
    bundle = schema.obj(report["bundle"], f"{where} bundle", FIX)
    if bundle.get("policy") != result.policy:
        raise InputError(f"{where}: its bundle holds the policy {str(bundle.get('policy'))[:80]!r}, its tune block "
                         f"names {result.policy!r}", FIX)  # fmt: skip
    if bundle.get("manifest_sha256") != result.shipped.manifest_sha256:
        raise InputError(f"{where}: the bundle it benched is not the bundle it shipped (manifest sha256 "
                         f"{str(bundle.get('manifest_sha256'))[:12]} vs {result.shipped.manifest_sha256[:12]})", FIX)  # fmt: skip
    threads = {m.get("name"): m.get("threads") for m in report["models"] if isinstance(m, dict)}
    if threads.get(c.name) != c.threads:
        raise InputError(
            f"{where}: its choice was benched at {threads.get(c.name)!r} thread(s), chosen at {c.threads}",
            FIX,
        )


def check_shipped_bundle(result: TuneResult, folder: Path, where: str) -> None:
    """The shipped bundle beside tune.json, when it is there, is the one tune.json describes."""
    if result.shipped is None or result.choice is None:
        raise InputError(
            f"{where} has no choice or no shipped bundle: tune writes tune.json only for a choice", FIX
        )
    rel = PurePosixPath(result.shipped.path)
    if len(rel.parts) != 1 or rel.name in ("", ".", "..") or "\\" in result.shipped.path:
        raise InputError(
            f"{where} names its shipped bundle by a path that is not a plain name in its folder", FIX
        )
    bundle = folder / rel.name
    if not (bundle / MANIFEST_NAME).is_file():
        return  # tune.json was copied away from its bundle: its own numbers were checked above
    try:
        manifest = load_manifest(bundle)
        sha = sha256_file(bundle / MANIFEST_NAME)
    except QuarlError as e:
        raise InputError(f"{where}: its shipped bundle {str(bundle)!r} fails its check ({e})", FIX) from None
    problem = None
    if sha != result.shipped.manifest_sha256:
        problem = f"its manifest sha256 is {sha[:12]}, tune.json says {result.shipped.manifest_sha256[:12]}"
    elif manifest.policy.name != result.policy:
        problem = f"it holds the policy {manifest.policy.name!r}, tune.json names {result.policy!r}"
    elif {m.name: m.sha256 for m in manifest.models} != dict(result.shipped.models):
        problem = "its models are not the ones tune.json names"
    elif manifest.tune is None or manifest.tune.chosen != result.choice.name:
        problem = f"its manifest does not name {result.choice.name!r} as tune's choice"
    if problem:
        raise InputError(
            f"{where}: the bundle beside it ({str(bundle)!r}) is not the one it describes: {problem}", FIX
        )
