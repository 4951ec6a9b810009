"""The device side (``python -m quarl_edge.runtimes``) never imports torch or TensorFlow.

Dynamic proof: the runner runs in a subprocess whose ``sitecustomize`` makes every import of torch or
tensorflow fail (as on a board where they are not installed) and logs who tried. Static proof: no file
of the runtimes folder imports them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNTIMES = ROOT / "runtimes"
BLOCKED = ("torch", "tensorflow")

SITECUSTOMIZE = '''
import atexit, os, sys

_LOG = os.environ["QUARL_IMPORT_LOG"]
_BLOCKED = {blocked!r}


def _log(line):
    with open(_LOG, "a") as f:
        f.write(line + "\\n")


class _Blocker:
    """Acts as if torch / tensorflow were not installed; records which module asked for them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in _BLOCKED:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back
        who = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        _log(f"blocked {{name}} for {{who}}")
        raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)


sys.meta_path.insert(0, _Blocker())
_log("installed")


@atexit.register
def _loaded():
    _log("loaded " + " ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("quarl_edge",) + _BLOCKED)))
'''


@pytest.fixture
def blocked_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(blocked=BLOCKED))
    log = tmp_path / "imports.log"
    env = dict(os.environ, PYTHONPATH=str(site), QUARL_IMPORT_LOG=str(log), PYTHONWARNINGS="ignore")
    return env, log


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_blocker_works(blocked_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log = blocked_env
    for mod in BLOCKED:
        p = _run(["-c", f"import {mod}"], env, tmp_path)
        assert p.returncode != 0 and "blocked by the test" in p.stderr
    assert log.read_text().startswith("installed\n")


@pytest.mark.parametrize("model", ["onnx-int8", "onnx-fp16"])
def test_device_runner_runs_without_torch(
    model: str, cartpole_bundle: Path, blocked_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, log = blocked_env
    p = _run(
        ["-m", "quarl_edge.runtimes", "run", "--bundle", str(cartpole_bundle), "--model", model,
         "--seeds", "1,2", "--latency-samples", "50"],
        env,
        tmp_path,  # not the repo root: the installed package mapping is what the device sees
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    events = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert events[-1]["event"] == "result"
    result: dict[str, Any] = events[-1]["result"]
    assert result["torch_imported"] is False
    assert result["model"] == model and result["runtime"].startswith("onnxruntime")
    assert [e["seed"] for e in result["episodes"]] == [1, 2]
    assert all(e["error"] is None and e["length"] > 0 for e in result["episodes"])
    assert result["latency"]["count"] == 50
    assert len(result["replay_actions"]) == 1000 and set(result["replay_actions"]) <= {0, 1}

    lines = log.read_text().splitlines()
    assert lines[0] == "installed"
    # nothing of ours even tried (a third-party probe of an optional torch would be listed, not fatal)
    attempts = [ln for ln in lines if ln.startswith("blocked ")]
    assert not [a for a in attempts if " for quarl_edge" in a], attempts
    loaded = next(ln for ln in lines if ln.startswith("loaded ")).split()[1:]
    assert not [m for m in loaded if m.split(".")[0] in BLOCKED]
    assert "quarl_edge.runtimes.runner" in loaded
    host_side = [m for m in loaded if m != "quarl_edge" and not m.startswith("quarl_edge.runtimes")]
    assert host_side == [], f"device run loaded host modules: {host_side}"


def test_runtime_api_and_control_loop_example_run_without_torch(
    cartpole_bundle: Path, blocked_env: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    """`load_policy().act()` in a user's script, and examples/control_loop.py, with torch blocked."""
    env, log = blocked_env
    code = (
        "import numpy as np\nfrom quarl_edge.runtimes import load_policy\n"
        f"p = load_policy({str(cartpole_bundle)!r}, model='onnx-int8')\n"
        "p.reset(); print(p.act(np.zeros(4, np.float32)), p.info.runtime)\n"
    )
    p = _run(["-c", code], env, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() in (["0", "onnxruntime"], ["1", "onnxruntime"])
    loaded = next(ln for ln in log.read_text().splitlines() if ln.startswith("loaded ")).split()[1:]
    assert "quarl_edge.runtimes.policy" in loaded
    assert [m for m in loaded if m != "quarl_edge" and not m.startswith("quarl_edge.runtimes")] == []
    example = ROOT / "examples" / "control_loop.py"
    p = _run([str(example), str(cartpole_bundle), "--model", "onnx-int8", "--hz", "500", "--steps", "20", "--json"],
             env, tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["steps"] == 20
    assert " for quarl_edge" not in log.read_text() and "for __main__" not in log.read_text()


def test_device_info_runs_without_torch(blocked_env: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log = blocked_env
    p = _run(["-m", "quarl_edge.runtimes", "info"], env, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads(p.stdout.splitlines()[-1])
    assert info["event"] == "info" and info["runtimes"]["onnxruntime"]
    assert info["cpu_features"] and info["ort_providers"] and "emulation" in info
    assert "blocked torch for quarl_edge" not in log.read_text()


# ---- static check ----------------------------------------------------------------------------------

_TEXT = re.compile(r"^\s*(?:import|from)\s+(?:torch|tensorflow)\b", re.MULTILINE)
_DYNAMIC = re.compile(r"""(?:import_module|__import__)\(\s*["'](?:torch|tensorflow)""")


# The one exception: the LiteRT adapter falls back to tensorflow.lite inside the function that picks an
# interpreter, tried only when neither ai_edge_litert nor tflite_runtime is installed (a host with full
# TensorFlow and nothing smaller). Never at module level; the dynamic tests above show it is not reached.
FALLBACK_FUNCTIONS = {"litert.py": "interpreter_class"}


def _without_fallback(path: Path, text: str) -> str:
    name = FALLBACK_FUNCTIONS.get(path.name)
    if name is None:
        return text
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    assert fn.end_lineno is not None
    lines = text.splitlines(keepends=True)
    return "".join(line for i, line in enumerate(lines, 1) if not fn.lineno <= i <= fn.end_lineno)


def _device_files() -> list[Path]:
    return [*sorted(RUNTIMES.rglob("*.py")), ROOT / "quarl_edge" / "__init__.py"]


def _absolute_imports(path: Path) -> list[str]:
    mods = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            mods += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.append(node.module)
    return mods


def test_runtimes_folder_is_what_gets_imported() -> None:
    import quarl_edge.runtimes

    assert Path(quarl_edge.runtimes.__file__).resolve().parent == RUNTIMES
    assert len(list(RUNTIMES.glob("*.py"))) >= 5


@pytest.mark.parametrize("path", _device_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_torch_or_tensorflow_import_in_device_code(path: Path) -> None:
    text = _without_fallback(path, path.read_text())
    assert not _TEXT.search(text), f"{path.name} imports torch/tensorflow"
    assert not _DYNAMIC.search(text), f"{path.name} imports torch/tensorflow dynamically"
    for mod in _absolute_imports(path):
        root = mod.split(".")[0]
        assert root not in BLOCKED, f"{path.name}: import {mod}"
        # device code reaches our own code only inside quarl_edge.runtimes (the rest needs torch)
        if root == "quarl_edge":
            assert mod.startswith("quarl_edge.runtimes"), f"{path.name}: import {mod}"
        else:
            # cryptography: only inside the functions that check a signed bundle (runtimes/signing.py)
            allowed = {
                "numpy",
                "onnxruntime",
                "gymnasium",
                "ale_py",
                "ai_edge_litert",
                "tflite_runtime",
                "cryptography",
            }
            assert root in sys.stdlib_module_names or root in allowed, f"{path.name}: import {mod}"
