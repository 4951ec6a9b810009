"""A bundle runs only what its manifest verified (issue 15, integrity): an ONNX model that pulls its
weights from an external-data file the manifest does not hash is refused, and a manifest cannot make
the runner import an arbitrary module through env.imports."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import interruptible

from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.parity import ModelParity, SourceParity
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.spec import EnvConfig
from quarl_edge.runtimes.tunechoice import TuneChoice


def _rehash(bundle: Path, name: str) -> None:
    doc = json.loads((bundle / "manifest.json").read_text())
    for m in doc["models"]:
        if m["name"] == name:
            path = bundle / m["file"]
            m["sha256"], m["size_bytes"] = sha256_file(path), path.stat().st_size
    (bundle / "manifest.json").write_text(json.dumps(doc))


def test_an_onnx_model_with_unhashed_external_data_is_refused(cartpole_bundle: Path, tmp_path: Path) -> None:
    bundle = Path(shutil.copytree(cartpole_bundle, tmp_path / "b"))
    entry = load_manifest(bundle).model("onnx-fp32")
    model = onnx.load(str(bundle / entry.file))
    # the weights move to a side file the manifest knows nothing about; the .onnx is re-hashed
    onnx.save_model(model, str(bundle / entry.file), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)  # fmt: skip
    _rehash(bundle, "onnx-fp32")
    side = bundle / "weights.bin"
    side.write_bytes(np.zeros(side.stat().st_size, np.uint8).tobytes())  # tampered: every weight 0
    load_manifest(bundle)  # every file the manifest names still checks out
    with pytest.raises(IntegrityError, match="not a loadable ONNX model"):
        PolicyRunner(bundle, "onnx-fp32", threads=1)
    # control: the untampered bundle's model runs
    PolicyRunner(cartpole_bundle, "onnx-fp32", threads=1).act(np.zeros(4, np.float32))


@pytest.mark.parametrize("module", ["os", "subprocess", "quarl_edge.policy.net", "this"])
def test_env_imports_only_environment_packages(module: str) -> None:
    cfg = EnvConfig(id="CartPole-v1", imports=(module,))
    with pytest.raises(InputError, match="not an environment package"):
        make_env(cfg)


def test_env_imports_of_an_environment_package_are_imported() -> None:
    pytest.importorskip("ale_py")
    env = make_env(EnvConfig(id="ALE/Pong-v5", imports=("ale_py",), make_kwargs={"frameskip": 1}))
    env.close()


# ---- the runner's errors name the real cause (issue 15) --------------------------------------------


def test_bench_with_a_trace_of_another_env_names_the_env_before_any_runner(
    cartpole_bundle: Path, pendulum_calib: Path
) -> None:
    from quarl_edge.bench.run import BenchConfig, bench

    with pytest.raises(InputError) as e:  # was "the runner crashed: ... report a bug"
        bench(cartpole_bundle, BenchConfig(episodes=1, latency_samples=5, trace=pendulum_calib))
    assert (
        "shape [3]" in str(e.value) and "CartPole-v1" in str(e.value) and "report a bug" not in str(e.value)
    )


def test_a_negative_seed_is_refused_as_such() -> None:
    from quarl_edge.bench.run import BenchConfig

    with pytest.raises(InputError, match="--seed must be >= 0"):  # was "the runner returned no result"
        BenchConfig(seed=-5)


def test_threads_beyond_the_devices_cores_are_refused_unless_asked_for(cartpole_bundle: Path) -> None:
    import os

    from quarl_edge.runtimes.runner import run_model

    too_many = (os.cpu_count() or 1) + 1
    with pytest.raises(InputError, match="cores of this device"):
        run_model(cartpole_bundle, "onnx-fp32", seeds=[], threads=too_many, latency_samples=5)
    run = run_model(
        cartpole_bundle, "onnx-fp32", seeds=[], threads=too_many, latency_samples=5, oversubscribe=True
    )
    assert run.threads == too_many
    with pytest.raises(InputError, match="not a thread count"):
        from quarl_edge.bench.run import BenchConfig

        BenchConfig(threads=100_000)


def test_ctrl_c_during_a_bench_is_exit_130_and_says_what_was_kept(
    cartpole_bundle: Path, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "r.json"
    partial = tmp_path / "r.partial.json"
    exe = Path(sys.executable).parent / "quarl-edge"
    proc = subprocess.Popen([str(exe), "bench", "--bundle", str(cartpole_bundle), "--episodes", "200",
                             "--latency-samples", "20", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)  # fmt: skip
    deadline = time.monotonic() + 120  # a deadline for the bench to keep its first episode, not a timing
    while not (partial.is_file() and '"seed"' in partial.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err
    assert (
        lines[-1].startswith("error: interrupted; finished episodes are kept in") and "--resume" in lines[-1]
    )
    assert "Traceback" not in err and partial.is_file() and not out.exists()


@pytest.mark.slow
def test_ctrl_c_during_an_export_is_exit_130_and_leaves_nothing(
    zoo_pong: tuple[Path, Path], tmp_path: Path
) -> None:
    """Was: 'the policy uses an op torch.onnx cannot export' (exit 2) when the converter wrapped the Ctrl-C."""
    import os
    import signal
    import subprocess
    import sys
    import time

    policy, frames = zoo_pong
    out = tmp_path / "b"
    exe = Path(sys.executable).parent / "quarl-edge"
    proc = subprocess.Popen([str(exe), "export", "--policy", str(policy), "--calibration", str(frames),
                             "--to", "onnx-fp32,onnx-int8,tflite-fp32,tflite-int8", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)  # fmt: skip
    time.sleep(6)  # into the conversions (the whole export takes ~20 s here)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err
    assert (
        lines[-1].startswith("error: interrupted") and "cannot export" not in err and "Traceback" not in err
    )
    assert not out.exists() and not list(tmp_path.glob(".b.*"))


SWALLOWED_CTRL_C = """
import os, signal, sys, time
from pathlib import Path
from quarl_edge import interrupts
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.load import load_policy
from quarl_edge.runtimes.errors import Interrupted

interrupts.install()
try:  # what a converter that catches everything does with a Ctrl-C
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)  # the KeyboardInterrupt is raised here
except BaseException:
    pass
assert interrupts.received()
out = Path(sys.argv[3])
try:
    export_bundle(load_policy(Path(sys.argv[1])), BundleRequest(out=out, targets=("onnx-fp32",), calibration=Path(sys.argv[2])))
except Interrupted as e:
    print("interrupted:", e)
    sys.exit(130)
print("exported")
"""


def test_a_ctrl_c_a_converter_swallows_still_stops_the_export_before_the_swap(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    """Was: a Ctrl-C that landed in ONNX Runtime's pre-processing fallback (``except Exception``) or a
    converter that dropped it let `export` finish and write the bundle with exit 0 (seen in CI)."""
    import subprocess
    import sys

    out = tmp_path / "b"
    p = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C, str(cartpole_policy), str(cartpole_calib), str(out)],
                       capture_output=True, text=True, timeout=300, preexec_fn=interruptible)  # fmt: skip
    assert p.returncode == 130, p.stdout + p.stderr
    assert "interrupted:" in p.stdout and "left as it was" in p.stdout
    assert not out.exists() and not list(tmp_path.glob(".b.*"))
    # the same export without the Ctrl-C writes the bundle: the check is what stopped it
    ok = subprocess.run([sys.executable, "-c", SWALLOWED_CTRL_C.replace("interrupts.install()", "pass").replace(
        "assert interrupts.received()", ""), str(cartpole_policy), str(cartpole_calib), str(out)],
        capture_output=True, text=True, timeout=300, preexec_fn=interruptible)  # fmt: skip
    assert ok.returncode == 0 and "exported" in ok.stdout, ok.stdout + ok.stderr
    assert (out / "manifest.json").is_file()


# ---- the manifest's result blocks are typed and checked on load ----------------------------------------


def _with_block(src: Path, dest: Path, key: str, edit: Any) -> Path:
    """A copy of the bundle ``src`` whose manifest's ``key`` block is ``edit(block)`` (the block itself
    when ``edit`` is not callable)."""
    bundle = Path(shutil.copytree(src, dest))
    doc = json.loads((bundle / "manifest.json").read_text())
    doc[key] = edit(copy.deepcopy(doc.get(key))) if callable(edit) else edit
    (bundle / "manifest.json").write_text(json.dumps(doc))
    return bundle


def _model_row(**kv: Any) -> Any:
    def edit(block: dict[str, Any]) -> dict[str, Any]:
        block["models"][0].update(kv)
        return block

    return edit


BAD_PARITY = {  # (what the block becomes, what the one line names)
    "agreement 7.0": (_model_row(agreement=7.0), "source_parity.models[0].agreement 7.0 is not a share in [0, 1]"),
    "negative diff": (_model_row(max_abs_diff=-0.5), "source_parity.models[0].max_abs_diff -0.5 is negative"),
    "nan diff": (_model_row(mean_abs_diff=float("nan")), "source_parity.models[0].mean_abs_diff is not a finite"),
    "samples 0": (_model_row(samples=0), "source_parity.models[0].samples is not an integer >= 1"),
    "samples 1.5": (_model_row(samples=1.5), "source_parity.models[0].samples is not an integer >= 1"),
    "model a number": (_model_row(model=7), "source_parity.models[0].model is not a string"),
    "no reference": (lambda b: {k: v for k, v in b.items() if k != "reference"}, "lacks the field 'reference'"),
    "models not a list": (lambda b: {**b, "models": "onnx-fp32"}, "source_parity.models is not a list"),
    "error and models": (lambda b: {**b, "error": "x"}, "has both an error and measured models"),
    "not an object": ([1, 2], "bundle manifest source_parity is not an object"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_PARITY, ids=list(BAD_PARITY))
def test_a_bad_source_parity_is_refused_on_load_in_one_line(
    cartpole_bundle: Path, tmp_path: Path, case: str
) -> None:
    edit, says = BAD_PARITY[case]
    assert load_manifest(cartpole_bundle).source_parity is not None  # the export measured it
    bundle = _with_block(cartpole_bundle, tmp_path / "b", "source_parity", edit)
    with pytest.raises(InputError) as e:
        load_manifest(bundle)
    line = str(e.value)
    assert "\n" not in line and says in line and line.endswith("re-export the bundle"), line


def test_source_parity_reads_back_as_written(cartpole_bundle: Path, tmp_path: Path) -> None:
    doc = json.loads((cartpole_bundle / "manifest.json").read_text())
    parity = load_manifest(cartpole_bundle).source_parity
    assert parity is not None and parity.error is None and parity.models[0].samples >= 1
    assert parity.to_dict() == doc["source_parity"]
    assert SourceParity.from_dict(parity.to_dict(), "x") == parity
    assert load_manifest(cartpole_bundle).to_dict() == doc  # the whole manifest, unchanged
    failed = SourceParity("TQC.predict (sb3-contrib 2.9.2)", error="ImportError: no sb3_contrib")
    assert failed.to_dict() == {"reference": failed.reference, "models": [], "error": failed.error}
    bundle = _with_block(cartpole_bundle, tmp_path / "b", "source_parity", failed.to_dict())
    assert load_manifest(bundle).source_parity == failed
    assert failed.line() == f"fp32 vs source ({failed.reference}): not measured ({failed.error})"
    m = ModelParity("onnx-fp32", 10, 0.95, 0.25, 0.01)
    line = SourceParity("TD3.predict", (m,)).line()
    assert line == "fp32 vs source (TD3.predict): onnx-fp32 agreement 0.9500, max |Δa| 0.25 on 10 states"
    with pytest.raises(InputError, match="agreement"):  # checked when made, too
        ModelParity("onnx-fp32", 10, 1.5, None, None)


TUNED = {"chosen": "onnx-int8", "threads": 2, "device": "rpi4", "emulated": False,
         "evidence": {"name": "onnx-int8", "threads": 2, "p99_us": 80.0}, "policy_sha256": "ab" * 32,
         "measured": {"onnx-fp32": "cd" * 32, "onnx-int8": "ef" * 32}}  # fmt: skip
BAD_TUNE = {  # (the tune block, what the one line names)
    "threads 0": ({**TUNED, "threads": 0}, "tune.threads is not an integer in [1, 256]"),
    "threads a string": ({**TUNED, "threads": "4"}, "tune.threads is not an integer"),
    "no chosen": ({k: v for k, v in TUNED.items() if k != "chosen"}, "tune.chosen is not a string"),
    "device a number": ({**TUNED, "device": 4}, "tune.device is not a string"),
    "emulated a string": ({**TUNED, "emulated": "no"}, "tune.emulated is not true or false"),
    "evidence a list": ({**TUNED, "evidence": []}, "tune.evidence is not an object"),
    "measured sha a number": ({**TUNED, "measured": {"onnx-int8": 5}}, "tune.measured['onnx-int8'] is not a string"),
    "not an object": ("onnx-int8", "bundle manifest tune is not an object"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_TUNE, ids=list(BAD_TUNE))
def test_a_bad_tune_block_is_refused_on_load_in_one_line(
    cartpole_bundle: Path, tmp_path: Path, case: str
) -> None:
    block, says = BAD_TUNE[case]
    bundle = _with_block(cartpole_bundle, tmp_path / "b", "tune", block)
    with pytest.raises(InputError) as e:
        load_manifest(bundle)
    line = str(e.value)
    assert "\n" not in line and says in line and line.endswith("re-run `quarl-edge tune`"), line


def test_a_tune_block_reads_back_as_written(cartpole_bundle: Path, tmp_path: Path) -> None:
    bundle = _with_block(cartpole_bundle, tmp_path / "b", "tune", TUNED)
    tune = load_manifest(bundle).tune
    assert tune == TuneChoice("onnx-int8", 2, "rpi4", False, TUNED["evidence"], "ab" * 32,
                              (("onnx-fp32", "cd" * 32), ("onnx-int8", "ef" * 32)))  # fmt: skip
    assert tune.to_dict() == TUNED and list(tune.to_dict()) == list(TUNED)  # the same keys in the same order
    assert load_manifest(bundle).to_dict() == json.loads((bundle / "manifest.json").read_text())
    bare = {"chosen": "onnx-int8", "threads": 1, "device": "rpi4"}  # what older tests and hand edits hold
    assert TuneChoice.from_dict(bare).to_dict() == bare
    with pytest.raises(InputError, match="tune.threads"):  # checked when made, too
        TuneChoice("onnx-int8", 0, "rpi4")


@pytest.mark.parametrize(
    ("block", "says"),
    [({"file": "trace.npz", "sha256": "ab" * 32, "samples": -1}, "trace.samples is not an integer in [0, "),
     ({"file": "trace.npz", "sha256": 5}, "trace.sha256 is not a string"),
     ({"sha256": "ab" * 32}, "trace.file"),
     ("trace.npz", "bundle manifest trace is not an object")],
)  # fmt: skip
def test_a_bad_trace_block_is_refused_on_load_in_one_line(
    cartpole_bundle: Path, tmp_path: Path, block: Any, says: str
) -> None:
    bundle = _with_block(cartpole_bundle, tmp_path / "b", "trace", block)
    with pytest.raises(InputError) as e:
        load_manifest(bundle, verify=False)
    assert "\n" not in str(e.value) and says in str(e.value), str(e.value)
    trace = load_manifest(cartpole_bundle).trace
    assert (
        trace is not None
        and trace.to_dict() == json.loads((cartpole_bundle / "manifest.json").read_text())["trace"]
    )
