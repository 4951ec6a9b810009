"""Issue 15, points 1-4: outputs never destroy what they did not create, the gate cannot pass on
nothing, a finished measurement is never lost, untrusted text is data.

Each test names the defect it catches; each would fail on the code before the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_one_error
from report_json import model_json, report_json

from quarl_edge.bench import fleet as bench_fleet
from quarl_edge.bench.fleet import bench_on_device
from quarl_edge.bench.partial import partial_path
from quarl_edge.bench.report import parse_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bench.transport import LocalTransport
from quarl_edge.bundle import WORK_PREFIX, BundleRequest, export_bundle
from quarl_edge.common.limits import parse_percent
from quarl_edge.gate import Check, GateConfig, evaluate, junit_xml, markdown_summary
from quarl_edge.policy.net import load_checkpoint, save_checkpoint
from quarl_edge.record import RecordConfig, record_to_file
from quarl_edge.runtimes import fsutil
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import clean_leftovers
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.text import clean, md_cell

FAST = BenchConfig(episodes=1, latency_samples=20, warmup=1)
HOURS_AGO = time.time() - 5 * 3600
DEAD_PID = 2**22 + 1  # above Linux's largest pid_max: never a running process


# --- helpers -----------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (itself included) -> what it is: a file's sha256, a link's target."""
    out: dict[str, str] = {}
    for p in [root, *sorted(root.rglob("*"))]:
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = f"link:{os.readlink(p)}"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_error(p: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr and len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


@pytest.fixture
def work(tmp_path: Path, cartpole_policy: Path, cartpole_calib: Path) -> Path:
    """tmp_path with private copies of the shipped CartPole policy (pol/) and its calibration (calib/)."""
    shutil.copytree(cartpole_policy, tmp_path / "pol")
    (tmp_path / "calib").mkdir()
    shutil.copy(cartpole_calib, tmp_path / "calib" / "cartpole-ppo.npz")
    return tmp_path


def _request(work: Path, out: Path, **kw: Any) -> BundleRequest:
    calib = work / "calib" / "cartpole-ppo.npz"
    return BundleRequest(
        out=out, targets=("onnx-fp32",), calibration=calib, reads=(("policy", work / "pol"),), **kw
    )


def _refused(work: Path, out: Path, expect: str) -> None:
    before = snapshot(work)
    with pytest.raises(InputError, match=expect):
        export_bundle(load_checkpoint(work / "pol"), _request(work, out))
    assert snapshot(work) == before


@pytest.fixture
def bundle(cartpole_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(cartpole_bundle, tmp_path / "bundle"))


def _rename(bundle: Path, names: dict[str, str]) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    for m in manifest["models"]:
        m["name"] = names.get(m["name"], m["name"])
    (bundle / "manifest.json").write_text(json.dumps(manifest))


_model, _report = (
    model_json,
    report_json,
)  # complete reports: the gate reads only valid ones (bench/result.py)


NORMAL = _report(_model("onnx-fp32", "fp32", None), _model("onnx-fp16", "fp16"), _model("onnx-int8", "int8"))


# XSD facts (Jenkins xunit-plugin junit-10.xsd, the schema CI servers read): element -> (allowed
# children, required attributes, allowed attributes)
_XSD: dict[str, tuple[set[str], set[str], set[str]]] = {
    "testsuites": ({"testsuite"}, set(), {"name", "time", "tests", "failures", "disabled", "errors"}),
    "testsuite": ({"testsuite", "properties", "testcase", "system-out", "system-err"}, {"tests"},
                  {"name", "tests", "failures", "errors", "time", "disabled", "skipped", "skips", "timestamp",
                   "hostname", "id", "package", "assertions", "file", "skip", "log", "url"}),
    "testcase": ({"skipped", "error", "failure", "system-out", "system-err"}, {"name"},
                 {"name", "assertions", "time", "timestamp", "classname", "status", "class", "file", "line",
                  "log", "group", "url"}),
    "failure": (set(), set(), {"type", "message"}),
}  # fmt: skip


def _check_xsd(el: ET.Element) -> None:
    children, required, allowed = _XSD[el.tag]
    assert required <= set(el.attrib) <= allowed, (el.tag, el.attrib)
    for child in el:
        assert child.tag in children, (el.tag, child.tag)
        _check_xsd(child)


# --- 1. outputs never destroy what they did not create -------------------------------------------------


def test_export_out_home_is_refused_and_changes_nothing(
    cli: Any, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: `export --out ~` replaced a home folder (with its .ssh/) by a bundle, exit 0."""
    home = work / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / "notes.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    before = snapshot(work)
    p = cli("export", "--policy", "pol", "--calibration", "calib/cartpole-ppo.npz", "--to", "onnx-fp32",
            "--out", Path.home())  # fmt: skip
    line = one_error(p)
    assert str(home) in line and "not a quarl-edge bundle" in line
    assert snapshot(work) == before


def test_export_out_the_policy_folder_is_refused_and_changes_nothing(cli: Any, work: Path) -> None:
    """Defect: `export --out runs/cartpole-ppo` (the policy being exported) deleted the trained policy."""
    before = snapshot(work)
    line = one_error(cli("export", "--policy", "pol", "--to", "onnx-fp32", "--out", "pol"))
    assert "'pol' is the policy" in line
    assert snapshot(work) == before


def test_export_refuses_the_calibration_folder_a_file_and_a_folder_holding_the_policy(work: Path) -> None:
    """Defects: `--out` on the calibration file's folder deleted every .npz in it; an ordinary file
    became a folder; a folder holding the policy would be replaced with it."""
    _refused(work, work / "calib", "holds the calibration file")
    (work / "notes.txt").write_text("mine")
    _refused(work, work / "notes.txt", "is a file")
    _refused(work, work, "holds the (calibration file|policy)")
    (work / "stuff").mkdir()
    (work / "stuff" / "a.txt").write_text("mine")
    _refused(work, work / "stuff", "is not a quarl-edge bundle")


def test_export_refuses_a_symlink_and_a_target_inside_a_bundle(work: Path, cartpole_bundle: Path) -> None:
    """Defect: a link as --out was replaced (os.replace renames the link), a bundle's files could be
    overwritten by another export nested in it."""
    (work / "elsewhere").mkdir()
    (work / "link").symlink_to(work / "elsewhere")
    _refused(work, work / "link", "symbolic link")
    shutil.copytree(cartpole_bundle, work / "b")
    _refused(work, work / "b" / "inner", "inside the bundle")


def test_export_replaces_its_own_bundle_but_not_one_holding_a_users_file(work: Path) -> None:
    """Re-exporting over a bundle is the documented default (atomic); a file the user put in it is not
    silently deleted with it."""
    policy = load_checkpoint(work / "pol")
    out = work / "bundles" / "b"
    export_bundle(policy, _request(work, out))
    first = snapshot(out)
    export_bundle(policy, BundleRequest(out=out, targets=("onnx-fp32", "onnx-int8"),
                                        calibration=work / "calib" / "cartpole-ppo.npz"))  # fmt: skip
    assert [m.name for m in load_manifest(out).models] == ["onnx-fp32", "onnx-int8"]
    assert snapshot(out) != first
    (out / "notes.md").write_text("my results")
    _refused(work, out, "also holds 'notes.md'")
    empty = work / "empty"
    empty.mkdir()
    export_bundle(policy, _request(work, empty))  # an empty folder holds nothing to lose
    assert (empty / "manifest.json").is_file()


def test_record_refuses_a_file_that_is_not_a_trace_and_a_target_in_the_policy(work: Path) -> None:
    """Defect: `record --out` replaced any file with a trace (and would write into the policy)."""
    policy = load_checkpoint(work / "pol")
    cfg = RecordConfig(episodes=1, max_steps=5)
    np.savez(work / "data.npz", x=np.arange(3))
    before = snapshot(work)
    with pytest.raises(InputError, match="is not a quarl-edge trace"):
        record_to_file(policy, cfg, work / "data.npz")
    with pytest.raises(InputError, match="inside the policy"):
        record_to_file(policy, cfg, work / "pol" / "calib.npz", [("policy", work / "pol")])
    assert snapshot(work) == before
    mine = work / "calib" / "cartpole-ppo.npz"
    record_to_file(policy, cfg, mine)  # our own trace is replaced
    assert json.loads(str(np.load(mine)["meta"][()]))["samples"] == 5


def test_train_refuses_an_out_that_is_not_a_checkpoint_before_training(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: `train --out` goes through the same writer and replaced any folder."""
    from quarl_edge.train import trainer
    from quarl_edge.train.trainer import TrainConfig, train

    def no_training(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the model was built: training started before --out was checked")

    monkeypatch.setattr(trainer, "_build_model", no_training)  # refused before any step of training
    (work / "runs").mkdir()
    (work / "runs" / "data.csv").write_text("1,2,3")
    before = snapshot(work)
    with pytest.raises(InputError, match="not a quarl-edge checkpoint"):
        train(TrainConfig(env="CartPole-v1", algo="ppo", out=work / "runs", steps=64))
    assert snapshot(work) == before


def test_zoo_add_refuses_an_entry_folder_that_is_not_a_checkpoint(work: Path) -> None:
    """Defect: `zoo add` replaced DIR/<name> whatever it was (after a long evaluation)."""
    from quarl_edge.zoo import add

    (work / "zoo" / "mine").mkdir(parents=True)
    (work / "zoo" / "mine" / "thesis.tex").write_text("years of work")
    before = snapshot(work)
    with pytest.raises(InputError, match="zoo entry .* not a quarl-edge checkpoint"):
        add(work / "pol", "mine", episodes=20, zoo=work / "zoo")
    with pytest.raises(InputError, match="is the policy"):
        add(work / "pol", "pol", episodes=20, zoo=work)
    assert snapshot(work) == before


def test_a_failed_checkpoint_save_keeps_the_trainers_resume_state(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: save_checkpoint moved resume/ into its temporary folder, so a save that failed (or was
    killed) took the resume state down with the temporary folder."""
    from quarl_edge.policy import net

    (work / "pol" / "resume").mkdir()
    (work / "pol" / "resume" / "sb3_model.zip").write_bytes(b"state of a 3-day run")
    policy = load_checkpoint(work / "pol")
    before = snapshot(work / "pol")

    def disk_full(path: Any, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(net, "atomic_write_bytes", disk_full)
    with pytest.raises(OSError):
        save_checkpoint(policy, work / "pol", keep=("resume",))
    assert snapshot(work / "pol") == before
    monkeypatch.undo()
    save_checkpoint(policy, work / "pol", keep=("resume",))
    assert (work / "pol" / "resume" / "sb3_model.zip").read_bytes() == b"state of a 3-day run"


def test_leftovers_of_killed_runs_are_cleaned_by_the_next_run(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: SIGKILLed exports left `.NAME.*.tmp` and /tmp/quarl-export-* behind forever. Only our
    own names are removed, and only a dead run's or an hours-old one."""
    systmp = work / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    out = work / "b"
    # loaded before the fresh entries are made: under a loaded CI machine the load alone took over a
    # minute, which aged "too fresh to judge" past the dead-writer grace period
    policy, request = load_checkpoint(work / "pol"), _request(work, out)

    def made(path: Path, when: float = HOURS_AGO, folder: bool = True) -> Path:
        path.mkdir() if folder else path.write_text("x")
        os.utime(path, (when, when))
        return path

    gone = [made(work / f".b.{DEAD_PID}.abcd1234.tmp", time.time() - 120),  # its process is gone
            made(work / ".b.zz99_xyz.tmp"),  # an earlier version's name, hours old
            made(work / f".b.{DEAD_PID}.qwer5678.tmp", folder=False),
            made(systmp / f"{WORK_PREFIX}-{DEAD_PID}-abcd1234", time.time() - 120),
            made(systmp / f"{WORK_PREFIX}-abcd1234")]  # fmt: skip
    kept = [made(work / ".b.1.abcd1234.tmp", time.time()),  # pid 1 runs: a live writer's
            made(work / ".b.notes.tmp"),  # not a name our writers make
            made(work / ".bb.abcd1234.tmp"),  # another target's
            made(systmp / f"{WORK_PREFIX}-{DEAD_PID}-new12345", time.time()),  # too fresh to judge
            made(systmp / "quarl-exports-abcd1234")]  # fmt: skip
    export_bundle(policy, request)
    assert [p for p in gone if os.path.lexists(p)] == []
    assert [p for p in kept if not p.exists()] == []


def test_a_replaced_folder_left_by_a_kill_between_two_renames_is_kept_until_the_new_one_exists(
    tmp_path: Path,
) -> None:
    """`.NAME.old-PID` is the only complete copy while NAME is missing: never removed then."""
    old = tmp_path / f".b.old-{DEAD_PID}"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    os.utime(old, (time.time() - 120, time.time() - 120))
    assert clean_leftovers(tmp_path / "b") == [] and old.exists()
    (tmp_path / "b").mkdir()
    assert clean_leftovers(tmp_path / "b") == [old] and not old.exists()


def test_bench_out_on_the_bundles_manifest_is_refused(cli: Any, bundle: Path) -> None:
    """Defect: `bench --bundle b --out b/manifest.json` wrote the report over the bundle's manifest."""
    before = snapshot(bundle)
    line = one_error(cli("bench", "--bundle", bundle, "--out", bundle / "manifest.json", "--episodes", "1"))
    assert "inside the bundle" in line
    assert snapshot(bundle) == before


def test_bench_refuses_a_markdown_or_partial_file_beside_out_that_is_not_ours(
    bundle: Path, tmp_path: Path
) -> None:
    """Defect: the report's .md (and .partial.json) beside --out replaced whatever had that name."""
    (tmp_path / "r.md").write_text("# my lab notes\n")
    (tmp_path / "q.partial.json").write_text('{"mine": true}')
    before = snapshot(tmp_path)
    with pytest.raises(InputError, match="report's Markdown"):
        bench_on_device(bundle, FAST, out=tmp_path / "r.json")
    with pytest.raises(InputError, match="partial results file"):
        bench_on_device(bundle, FAST, out=tmp_path / "q.json")
    assert snapshot(tmp_path) == before


def test_gate_outputs_never_overwrite_the_report(cli: Any, tmp_path: Path) -> None:
    """Defect: `gate r.json --junit r.json` replaced the report with the JUnit file."""
    (tmp_path / "r.json").write_text(json.dumps(NORMAL))
    before = snapshot(tmp_path)
    assert "is the report" in one_error(cli("gate", "r.json", "--junit", "r.json"))
    assert "is the report" in one_error(cli("gate", "r.json", "--markdown", "r.json"))
    assert snapshot(tmp_path) == before


# --- 2. the gate cannot pass on nothing --------------------------------------------------------------


def test_gate_on_an_fp32_only_report_is_unusable_input(cli: Any, tmp_path: Path) -> None:
    """Defect: a report holding only the fp32 reference gave "PASS", exit 0, JUnit tests="0"."""
    (tmp_path / "r.json").write_text(json.dumps(_report(_model("onnx-fp32", "fp32", None))))
    line = one_error(cli("gate", "r.json", "--junit", "j.xml", "--markdown", "g.md"))
    assert "nothing to check" in line and "PASS" not in line
    assert not (tmp_path / "j.xml").exists() and not (tmp_path / "g.md").exists()


@pytest.mark.parametrize(
    ("report", "expect"),
    [
        (_report(_model("onnx-fp32", "fp32", None), _model("onnx-int8", "int8"), _model("onnx-int8", "int8", 50.0)),
         "names the model 'onnx-int8' twice"),
        (_report(_model("onnx-fp32", "int8", None), _model("onnx-fp16", "fp16")), "not fp32"),
        (_report(_model("onnx-fp32", "fp32", None), _model("", "int8")), "without a name"),
        (_report(_model("onnx-fp32", "fp32", None), {**_model("x", "int8"), "name": 7}), "without a name"),
        (_report(_model("onnx-fp32", "fp32", None), _model("onnx-int8", "int8"), reference="onnx-fp64"),
         "not one of its models"),
    ],
)  # fmt: skip
def test_gate_refuses_duplicate_unknown_and_non_fp32_references(report: dict[str, Any], expect: str) -> None:
    """Defects: a duplicate name let one model go unchecked; a non-fp32 reference passed."""
    with pytest.raises(InputError, match=expect):
        evaluate(parse_report(report), GateConfig())


@pytest.mark.parametrize("flag", ["--max-reward-drop", "--min-agreement", "--max-p99-ms"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_gate_refuses_non_finite_thresholds(flag: str, value: str) -> None:
    """Defect: `--max-reward-drop inf` (or nan, which compares false both ways) turned the gate off."""
    number = parse_percent(value) if flag == "--max-reward-drop" else float(value)
    kw = {
        "--max-reward-drop": "max_reward_drop_pct",
        "--min-agreement": "min_agreement",
        "--max-p99-ms": "max_p99_ms",
    }
    with pytest.raises(InputError, match=f"{flag} must be a finite number"):
        GateConfig(**{kw[flag]: number})


def test_gate_cli_refuses_an_infinite_reward_drop(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(NORMAL))
    assert "finite" in one_error(cli("gate", "r.json", "--max-reward-drop", "inf"))


def test_a_manifest_whose_int8_is_renamed_onnx_fp32_is_refused(bundle: Path) -> None:
    """Defect: int8 renamed `onnx-fp32` was never run (shadowed by the real one) and the gate passed."""
    _rename(bundle, {"onnx-int8": "onnx-fp32"})
    with pytest.raises(InputError, match="names the model 'onnx-fp32' twice"):
        load_manifest(bundle)
    with pytest.raises(InputError, match="twice"):
        bench(bundle, FAST)


def test_junit_has_one_testcase_per_model_and_check_in_the_xsd_shape() -> None:
    """Defect: JUnit `tests="0"` on nothing checked; the file was string-built (escaping by hand)."""
    cfg = GateConfig(max_reward_drop_pct=2.0, min_agreement=0.9, max_p99_ms=1.0)
    normal = parse_report(NORMAL)
    checks = evaluate(normal, cfg)
    root = ET.fromstring(junit_xml(normal, checks))
    assert root.tag == "testsuites"
    _check_xsd(root)
    cases = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    # reward drop and agreement for each quantized model, latency for all three
    expected = {(m, c) for m in ("onnx-fp16", "onnx-int8") for c in ("reward_drop", "agreement")}
    expected |= {(m, "p99_latency") for m in ("onnx-fp32", "onnx-fp16", "onnx-int8")}
    assert sorted(cases) == sorted(expected) and len(cases) == len(checks) == 7
    assert root.find("testsuite").get("tests") == "7"  # type: ignore[union-attr]


# --- 3. a finished measurement is never lost ---------------------------------------------------------


def _counting(calls: list[list[str]]) -> LocalTransport:
    class Counting(LocalTransport):
        def __call__(self, bundle: Path, args: list[str]) -> Iterator[dict[str, Any]]:
            calls.append(args)
            yield from super().__call__(bundle, args)

    return Counting()


def test_a_report_that_cannot_be_written_keeps_the_partial_and_resume_writes_it(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: the .partial.json was deleted before the report was written, so with --out an existing
    folder the finished bench was lost and --resume said "nothing to resume"."""
    calls: list[list[str]] = []
    monkeypatch.setattr(bench_fleet, "transport_for", lambda _profile: _counting(calls))
    out = tmp_path / "r.json"
    cfg = BenchConfig(episodes=2, latency_samples=20, warmup=1, models=("onnx-int8",))

    def block(ev: dict[str, Any]) -> None:  # someone makes --out a folder while the bench runs
        if ev.get("event") == "model_done":
            out.mkdir(exist_ok=True)

    with pytest.raises(InputError) as exc:
        bench_on_device(bundle, cfg, out=out, progress=block)
    msg = str(exc.value)
    assert "report could not be written" in msg and str(partial_path(out)) in msg and "--resume" in msg
    saved = json.loads(partial_path(out).read_text())
    assert all(m["run"] is not None for m in saved["models"].values())
    ran = len(calls)
    out.rmdir()
    report = bench_on_device(bundle, cfg, out=out, resume=True)
    assert len(calls) == ran  # nothing measured again
    assert report.resumed is not None and report.resumed.episodes_kept == 4
    assert json.loads(out.read_text())["models"][1]["name"] == "onnx-int8"
    assert out.with_suffix(".md").is_file() and not partial_path(out).exists()


def test_a_failing_report_write_keeps_the_partial(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a write that fails underneath (disk full): one line naming the partial and --resume."""

    def disk_full(report: Any, path: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bench_fleet, "write_report", disk_full)
    out = tmp_path / "r.json"
    with pytest.raises(QuarlError, match="No space left on device.*kept in .*--resume"):
        bench_on_device(bundle, FAST, out=out)
    assert partial_path(out).is_file()


# --- 4. untrusted text is data -----------------------------------------------------------------------


def test_clean_leaves_no_control_character_and_shows_each() -> None:
    nasty = "a\x1b[2Jb\rc\nd\te\x00f\x7f\x9b\u202eg\ud800"
    shown = clean(nasty)
    assert shown == "a\\x1b[2Jb\\rc\\nd\\te\\x00f\\x7f\\x9b\\u202eg\\ud800"
    assert all(c.isprintable() for c in shown)
    assert clean("two\nlines", newlines=True) == "two\nlines"
    assert md_cell("x | pass |\n| y") == "x \\| pass \\|\\\\n\\| y"
    assert md_cell("<img src=x>") == "&lt;img src=x&gt;"


def test_output_prints_names_literally_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Defect: text went through rich as markup: `[/x]` crashed, `[red]` styled, ESC reached the terminal."""
    import typer

    from quarl_edge.cli._output import fail, info, table

    table("bundle [/x]", ["model"], [["[red]x[/red]"], ["m\x1b[2J"], ["a\nb"]])
    info("model [/x]: \x1b]0;owned\x07 done\r")
    with pytest.raises(typer.Exit):
        fail("device said: [bold]no[/bold]\x1b[2J\nFAKE SECOND LINE")
    got = capsys.readouterr()
    assert "[red]x[/red]" in got.out and "bundle [/x]" in got.out and "m\\x1b[2J" in got.out
    assert "model [/x]: \\x1b]0;owned\\x07 done\\r" in got.err
    errors = [line for line in got.err.splitlines() if line.startswith("error:")]
    assert errors == ["error: device said: [bold]no[/bold]\\x1b[2J\\nFAKE SECOND LINE"]
    assert "\x1b" not in got.out + got.err and "\r" not in got.out + got.err


def test_hostile_model_names_through_bench_and_gate(cli: Any, bundle: Path, tmp_path: Path) -> None:
    """Defects: a model named with `[/x]` crashed bench and gate (gate's exit 1 then meant "a model
    failed"); `ESC[2J` reached the terminal; the same name made --junit invalid XML; a name with a
    newline forged a "pass" row in --markdown. A bundle's model names are now of one safe alphabet
    (issue 27: they are file stems and runner arguments on a board), so bench refuses such a bundle in
    one line; a report is read from a file too, so gate still meets such names there."""
    forged = "| onnx-int8 | reward_drop | 0 | 2 | pass |"
    names = {"onnx-fp32": "fp32 [/x]", "onnx-fp16": "[red]x[/red]\x1b[2J", "onnx-int8": f"int8\n{forged}"}
    p = cli("bench", "--bundle", bundle, "--episodes", "1", "--latency-samples", "20", "--out", "r.json")
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    for m in report["models"]:
        m["name"] = names.get(m["name"], m["name"])
    report["reference"] = names.get(report["reference"], report["reference"])
    (tmp_path / "r.json").write_text(json.dumps(report))
    g = cli("gate", "r.json", "--max-reward-drop", "100%", "--junit", "j.xml", "--markdown", "g.md")
    assert g.returncode == 0, g.stderr
    assert "\x1b" not in g.stdout + g.stderr and "[red]x[/red]\\x1b[2J" in g.stdout
    root = ET.parse(tmp_path / "j.xml").getroot()
    _check_xsd(root)
    classnames = {c.get("classname") for c in root.iter("testcase")}
    assert classnames == {clean(names["onnx-fp16"]), clean(names["onnx-int8"])}
    md = (tmp_path / "g.md").read_text().splitlines()
    rows = [line for line in md if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(list(root.iter("testcase"))) == 2
    assert forged not in md
    _rename(bundle, names)
    p = cli("bench", "--bundle", bundle, "--episodes", "1", "--latency-samples", "20", "--out", "r2.json")
    line = assert_one_error(p)
    assert "model name 'fp32 [/x]' is not a safe name" in line and "\x1b" not in p.stderr


def test_export_shows_an_out_path_with_brackets_literally(cli: Any, work: Path) -> None:
    """Defect: `export --out 'b[/x]'` crashed printing the bundle table's title."""
    p = cli("export", "--policy", "pol", "--calibration", "calib/cartpole-ppo.npz", "--to", "onnx-fp32",
            "--out", "b[/x]")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "bundle b[/x]" in p.stdout


def test_junit_and_markdown_stay_well_formed_for_any_name() -> None:
    report = parse_report(
        _report(_model("onnx-fp32", "fp32", None), _model("a\"<&>'\x00\x1b[2J\n\ud800", "int8"))
    )
    checks = [*evaluate(report, GateConfig()), Check("x\n| y", "p99_latency", False, None, 1.0, "m\x01<b>")]
    root = ET.fromstring(junit_xml(report, checks))
    assert [c.get("classname") for c in root.iter("testcase")] == [
        clean("a\"<&>'\x00\x1b[2J\n\ud800"),
        "x\\n| y",
    ]
    assert root.find(".//failure").get("message") == "m\\x01<b>"  # type: ignore[union-attr]
    md = markdown_summary(report, checks).splitlines()
    assert len([line for line in md if line.startswith("| ")]) == 1 + len(checks)
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 6 for line in md if line.startswith("| "))


def test_fsutil_names_its_temporaries_with_the_writers_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What lets the next run tell a killed writer's leftover from a running one's."""
    seen: list[str] = []
    real = os.replace

    def spy(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(fsutil.os, "replace", spy)
    fsutil.atomic_write_text(tmp_path / "r.json", "{}")
    assert seen and seen[0].startswith(f".r.json.{os.getpid()}.") and seen[0].endswith(".tmp")
