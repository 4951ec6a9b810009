"""The runtime-only distribution (devices/runtime_wheel.py): reproducible, every runtimes module and
nothing else of ours, pip-installable offline into a fresh venv, where `quarl_edge.runtimes` imports
without torch (the deploy test in tests/test_devices_emulate.py installs it on the emulated board)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from quarl_edge import __version__
from quarl_edge.devices.runtime_wheel import build_runtime_wheel

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_is_reproducible_and_holds_the_runtimes_only() -> None:
    w = build_runtime_wheel()
    assert build_runtime_wheel().data == w.data and w.name.endswith("-py3-none-any.whl")
    names = set(zipfile.ZipFile(BytesIO(w.data)).namelist())
    modules = {f"quarl_edge/runtimes/{p.name}" for p in (ROOT / "runtimes").glob("*.py")}
    assert modules <= names and "quarl_edge/__init__.py" in names
    ours = {n for n in names if n.startswith("quarl_edge/")}
    assert ours == modules | {"quarl_edge/__init__.py"}  # no torch-side package rides along
    record = zipfile.ZipFile(BytesIO(w.data)).read(next(n for n in names if n.endswith("RECORD"))).decode()
    assert all(line.split(",")[0] in names for line in record.splitlines())


@pytest.mark.slow
def test_it_installs_offline_and_imports_without_torch(tmp_path: Path) -> None:
    w = build_runtime_wheel()
    wheel = tmp_path / w.name
    wheel.write_bytes(w.data)
    env = tmp_path / "venv"
    venv.create(env, with_pip=True, system_site_packages=False)
    py = env / "bin" / "python"
    r = subprocess.run(
        [py, "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    check = ("import sys, quarl_edge.runtimes as rt, quarl_edge; "
             "print(quarl_edge.__version__, rt.__file__.startswith(sys.prefix), 'torch' in sys.modules)")  # fmt: skip
    r = subprocess.run([py, "-I", "-c", check], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1:] == ["True", "False"]
    r = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
    assert (
        f"quarl-edge-runtime {__version__} requires numpy" in r.stdout
    )  # the one dependency, from the board's venv
    assert sys.executable != str(py)
