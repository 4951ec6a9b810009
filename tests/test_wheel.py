"""The wheel is the tool: every module and data file is in it, and it runs from outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import InstalledWheel

ROOT = Path(__file__).resolve().parent.parent

# source folder -> where the wheel installs it (pyproject's package-dir mapping)
ROLE_FOLDERS = {"quarl_edge": "quarl_edge", "exporters": "quarl_edge/exporters", "runtimes": "quarl_edge/runtimes",
                "devices": "quarl_edge/devices", "calibration_data": "quarl_edge/calibration_data"}  # fmt: skip
DATA_SUFFIXES = {".py", ".toml", ".npz", ".json", ".typed"}


def _source_files() -> set[str]:
    want = set()
    for src, dst in ROLE_FOLDERS.items():
        for f in (ROOT / src).rglob("*"):
            if f.is_file() and f.suffix in DATA_SUFFIXES and "__pycache__" not in f.parts:
                rel = f.relative_to(ROOT / src)
                if src == "quarl_edge" and rel.parts[0] in ROLE_FOLDERS:
                    continue
                want.add(f"{dst}/{rel.as_posix()}")
    return want


def _run(w: InstalledWheel, cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONWARNINGS="ignore", COLUMNS="200", PATH=f"{w.venv / 'bin'}:{env.get('PATH', '')}")
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_wheel_holds_every_module_and_data_file_of_the_source_tree(
    installed_wheel: InstalledWheel,
) -> None:
    names = set(zipfile.ZipFile(installed_wheel.wheel).namelist())
    want = _source_files()
    assert len(want) > 100  # the tree was found: ~90 modules, 11 policies, calibration data, profiles
    assert not want - names, sorted(want - names)
    assert any(n.startswith("quarl_edge/calibration_data/") and n.endswith(".npz") for n in names)
    assert not [
        n for n in names if n.startswith(("tests/", "docs/", "quarl_edge/quarl_edge/", "quarl_edge/tests/"))
    ]


def test_the_installed_package_walks_to_its_own_modules_only(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
    code = ("import json, pkgutil, quarl_edge; print(json.dumps([quarl_edge.__file__, sorted(m.name for m in "
            "pkgutil.walk_packages(quarl_edge.__path__, 'quarl_edge.'))]))")  # fmt: skip
    proc = _run(installed_wheel, tmp_path, str(installed_wheel.python), "-c", code)
    assert proc.returncode == 0, proc.stderr
    where, mods = json.loads(proc.stdout)
    assert Path(where).is_relative_to(installed_wheel.venv)  # the wheel's copy, not the checkout
    assert {"quarl_edge.cli", "quarl_edge.study.ptq", "quarl_edge.actorq.loop", "quarl_edge.runtimes.runner",
            "quarl_edge.exporters.onnx", "quarl_edge.devices.ssh", "quarl_edge.calibration_data"} <= set(mods)  # fmt: skip
    assert not [
        m for m in mods if m.startswith(("quarl_edge.tests", "quarl_edge.docs", "quarl_edge.quarl_edge"))
    ]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--help"], "study"),
        (["zoo", "list"], "pong-dqn"),
        (["study", "ptq", "--help"], "--confirm-episodes"),
        (["actorq", "--help"], "--actor-precision"),
        (["devices", "list"], "rpi4"),
    ],
)
def test_installed_commands_run_outside_the_checkout(
    installed_wheel: InstalledWheel, tmp_path: Path, args: list[str], expect: str
) -> None:
    proc = _run(installed_wheel, tmp_path, str(installed_wheel.exe), *args)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
    if args == ["zoo", "list"]:
        assert "MISSING" not in proc.stdout  # the shipped policies are in the wheel


@pytest.mark.slow
def test_installed_demo_exports_benches_gates_and_tunes_outside_the_checkout(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
    """`quarl-edge demo` from the installed wheel (the one demo run of the suite): export, bench, gate and
    tune on the embedded CartPole policy, every artifact written, nothing read from the checkout."""
    from test_bench_gate import _no_nan, check_report

    out = tmp_path / "demo"
    proc = _run(
        installed_wheel, tmp_path, str(installed_wheel.exe), "demo", "--out", "demo", "--episodes", "5"
    )
    assert proc.returncode == 0, proc.stderr
    assert ROOT.as_posix() not in proc.stderr  # nothing ran from the checkout
    assert "onnx-int8" in proc.stdout and "onnx-fp32" in proc.stdout and "reward" in proc.stdout
    assert "3/4 gate" in proc.stderr and "4/4 tune" in proc.stderr and "FAIL" not in proc.stderr
    for f in ("report.json", "report.md", "junit.xml", "gate.md", "bundle/manifest.json"):
        assert (out / f).is_file(), f
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert manifest["calibration"]["recorded_on_the_fly"] is False  # the shipped calibration data was found
    report = _no_nan((out / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["onnx-fp32", "onnx-fp16", "onnx-int8"]
    check_report(report, episodes=5, latency_samples=1000)
    root = ET.parse(out / "junit.xml").getroot()
    assert root.get("failures") == "0" and len(list(root.iter("testcase"))) == 2
    # the demo ends with tune's choice: the fastest that keeps reward, never slower than fp32 measured
    tuned = json.loads((out / "tune" / "tune.json").read_text())["tune"]
    fp32 = min(r["p50_us"] for r in tuned["candidates"] if r["precision"] == "fp32" and r.get("p50_us"))
    # the demo's tune has a short budget: on a loaded machine it may stop before judging every faster
    # candidate, and then says so (a note) and keeps the best judged so far
    out_of_time = any("budget reached" in n for n in tuned["notes"])
    assert (tuned["choice"]["p50_us"] <= fp32 or out_of_time) and "chosen:" in proc.stderr


@pytest.mark.slow
def test_the_makefiles_editable_install_prints_no_build_warning(tmp_path: Path) -> None:
    """`make demo` on a fresh clone: the Makefile's own `pip install -e .` line (its PYTHONWARNINGS, build
    isolation fetching today's setuptools) prints nothing from the build. Dependencies are not installed
    (--no-deps): the build is what prints, and the test venv already has them."""
    import shutil
    import sys

    from conftest import _SKIP_COPY

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY)
    dry = subprocess.run(["make", "-n", "-C", str(src), "-W", "pyproject.toml", ".venv/.installed-base"],
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    (line,) = [x for x in dry.splitlines() if " install " in x and " -e ." in x]
    assert line.startswith("PYTHONWARNINGS='"), line  # the filter is on the install line itself
    warn_filter = line.split("'")[1]
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONWARNINGS"] = warn_filter
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(tmp_path / "venv" / "bin" / "python"), "install", "--quiet",
         "--no-deps", "-e", "."], cwd=src, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # this machine's pip configuration names index folders it does not have: pip's lines, not the build's
    lines = [
        x for x in (proc.stdout + proc.stderr).splitlines() if not x.startswith("WARNING: Location 'file:")
    ]
    assert not [x for x in lines if x.strip()], lines
