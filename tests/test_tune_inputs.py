"""What tune refuses before it measures anything, and what gate refuses when it reads a tune.json back.

- every limit finite and in range (TuneConfig; the CLI refuses `--max-p99-ms nan` before the policy is
  loaded: no torch, no Ray);
- an ``--out`` holding anything tune did not write there (a user's notes.md, a .cache/state.json or tune.md
  that is not ours) is refused in one line and left exactly as it was;
- one tune per ``--out``: a second is refused at once (library and CLI);
- a tune.json whose choice was never benched, whose bundle holds another policy than its tune block names,
  whose numbers are impossible, or whose shipped bundle beside it is not the one it describes: refused by
  `gate` (exit 2, one line). The tune.json is a real one (one small tune, ~20 s), forged per case.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_error

from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.outdir import locked
from quarl_edge.tune.records import Timing
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.search import run_tune
from quarl_edge.tune.verify import check_tune_json, read_tune_json

NAN, INF = float("nan"), float("inf")


def small(policy: Path, out: Path, calib: Path | None = None, **kw: Any) -> TuneConfig:
    """The smallest real tune: the fp32 reference and one other fp32 format, 1 thread, 2 episodes."""
    args: dict[str, Any] = dict(policy=policy, out=out, calibration=calib, kinds=("fp32",), episodes=2,
                                confirm_episodes=0, max_threads=1, latency_samples=50, budget_min=5)  # fmt: skip
    return TuneConfig(**{**args, **kw})


def tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under ``path`` with its bytes (None for a folder)."""
    return {str(p.relative_to(path)): None if p.is_dir() else p.read_bytes() for p in sorted(path.rglob("*"))}


# ---- limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [("max_p99_ms", NAN, "--max-p99-ms"), ("max_p99_ms", INF, "--max-p99-ms"), ("max_p99_ms", -5.0, "--max-p99-ms"),
     ("max_p99_ms", 0.0, "--max-p99-ms"), ("max_threads", 0, "--max-threads"), ("max_threads", -1, "--max-threads"),
     ("max_threads", 10**9, "--max-threads"), ("max_reward_drop_pct", NAN, "--max-reward-drop"),
     ("max_reward_drop_pct", INF, "--max-reward-drop"), ("max_reward_drop_pct", -1.0, "--max-reward-drop"),
     ("budget_min", NAN, "--budget-min"), ("budget_min", INF, "--budget-min"), ("budget_min", -5.0, "--budget-min"),
     ("budget_min", 0.1, "--budget-min"), ("episodes", 1, "--episodes"), ("episodes", 10**9, "--episodes"),
     ("min_agreement", NAN, "--min-agreement"), ("min_agreement", 1.5, "--min-agreement"),
     ("confirm_episodes", -1, "confirm_episodes"), ("latency_samples", 0, "latency_samples")],
)  # fmt: skip
def test_every_limit_is_finite_and_in_range(field: str, value: Any, flag: str, tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        TuneConfig(policy=tmp_path / "p", out=tmp_path / "t", **{field: value})
    assert flag in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("args", "flag"),
    [(("--max-p99-ms", "nan"), "--max-p99-ms"), (("--max-threads", "-1"), "--max-threads"),
     (("--budget-min", "inf"), "--budget-min"), (("--max-reward-drop", "nan%"), "--max-reward-drop")],
)  # fmt: skip
def test_the_cli_refuses_a_bad_limit_before_loading_the_policy(cli: Any, tmp_path: Path, args: tuple[str, ...],
                                                               flag: str) -> None:  # fmt: skip
    # the policy does not exist: the error is the limit's, so the limit was checked first
    out = tmp_path / "t"
    p = cli("tune", "--policy", tmp_path / "no-such-policy", "--out", out, *args)
    assert flag in assert_one_error(p) and not out.exists()


# ---- --out --------------------------------------------------------------------------------------------


def _notes(d: Path) -> None:
    (d / "notes.md").write_text("my notes\n")


def _state(d: Path) -> None:
    (d / ".cache").mkdir()
    (d / ".cache" / "state.json").write_text('{"my": "state"}\n')


def _tune_md(d: Path) -> None:
    (d / "tune.md").write_text("# My tuning notes\n")


def _tune_json(d: Path) -> None:
    (d / "tune.json").write_text('{"mine": true}\n')


def _cache_notes(d: Path) -> None:
    (d / ".cache").mkdir()
    (d / ".cache" / "todo.txt").write_text("not a cache of tune's\n")


@pytest.mark.parametrize(
    ("make", "words"),
    [(_notes, "'notes.md'"), (_state, "'.cache'"), (_tune_md, "'tune.md'"), (_tune_json, "'tune.json'"),
     (_cache_notes, "'.cache'")],
)  # fmt: skip
def test_an_out_holding_what_tune_did_not_write_is_refused_before_anything(
    make: Callable[[Path], None], words: str, tmp_path: Path
) -> None:
    out = tmp_path / "t"
    out.mkdir()
    make(out)
    before = tree(out)
    # a policy that does not exist: the refusal comes before the policy is even read
    with pytest.raises(InputError) as e:
        run_tune(TuneConfig(policy=tmp_path / "no-such-policy", out=out))
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2
    assert tree(out) == before  # nothing written, nothing removed


def test_an_out_that_is_a_file_or_inside_the_policy_is_refused(cartpole_policy: Path, tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="is a file"):
        run_tune(TuneConfig(policy=cartpole_policy, out=f))
    with pytest.raises(InputError, match="is inside the policy"):
        run_tune(TuneConfig(policy=cartpole_policy, out=cartpole_policy / "tuned"))


# ---- one tune per --out ------------------------------------------------------------------------------


def test_a_second_tune_into_the_same_out_is_refused_at_once(
    cli: Any, cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    out = tmp_path / "t"
    with locked(out):  # as a running tune holds it
        with pytest.raises(InputError, match="another tune is writing to --out") as e:
            run_tune(small(cartpole_policy, out, cartpole_calib))
        assert "\n" not in str(e.value)
        p = cli("tune", "--policy", cartpole_policy, "--calibration", cartpole_calib, "--out", out,
                "--kinds", "fp32", "--episodes", "2", "--max-threads", "1", "--budget-min", "5")  # fmt: skip
        line = assert_one_error(p)
        assert "another tune is writing" in line and f"pid {os.getpid()}" in line
        assert sorted(x.name for x in (out / ".cache").iterdir()) == ["CACHEDIR.TAG", "lock"]
    with locked(out), pytest.raises(InputError), locked(out):  # released with its holder, held again
        pass


# ---- gate reads tune.json back -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_run(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> tuple[Path, int]:
    """One small tune, and how many times it called torch.onnx.export (the real one, counted)."""
    import torch

    out = tmp_path_factory.mktemp("tuned") / "t"
    real, calls = torch.onnx.export, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.onnx, "export", counted)
        run_tune(small(cartpole_policy, out, cartpole_calib))
    return out, len(calls)


@pytest.fixture(scope="module")
def tuned(tuned_run: tuple[Path, int]) -> Path:
    return tuned_run[0]


def test_one_tune_exports_the_policys_fp32_graph_once(tuned_run: tuple[Path, int]) -> None:
    """The reference bundle and the candidates bundle (its ONNX and C models) start from one torch.onnx
    export of the policy tune loaded (bundle.graph_cache): the same fp32 graph, byte for byte, in both."""
    from quarl_edge.runtimes.manifest import load_manifest

    out, exports = tuned_run
    result = read_tune_json(out / "tune.json")
    assert result is not None and result.reference == "onnx-fp32"
    assert {r.candidate.name for r in result.candidates} >= {"onnx-fp32", "c-fp32"}
    (reference,) = [p for p in out.rglob("reference-*") if (p / "manifest.json").is_file()]
    assert load_manifest(reference).model("onnx-fp32").sha256 == result.row("onnx-fp32").sha256
    assert exports == 1


@pytest.fixture
def forged(tuned: Path, tmp_path: Path) -> Path:
    """A copy of the real tune folder (tune.json and its bundle) for one forgery."""
    out = tmp_path / "t"
    shutil.copytree(tuned, out, ignore=shutil.ignore_patterns(".cache"))
    return out


def _edit(out: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads((out / "tune.json").read_text())
    change(data)
    (out / "tune.json").write_text(json.dumps(data))  # allow_nan: an inf is written as Infinity


def _choice_row(d: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in d["tune"]["candidates"] if r["name"] == d["tune"]["choice"]["name"])


def _other_sha(sha: str) -> str:
    return hashlib.sha256(sha.encode()).hexdigest()


FORGERIES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "choice never benched": (
        lambda d: d.update(models=[m for m in d["models"] if m["name"] != d["tune"]["choice"]["name"]]),
        "never benched"),
    "bundle holds another policy": (lambda d: d["bundle"].update(policy="pong-dqn"), "holds the policy 'pong-dqn'"),
    "tune names another policy": (lambda d: d["tune"].update(policy="pong-dqn"), "names 'pong-dqn'"),
    "agreement 7": (lambda d: _choice_row(d).update(agreement=7.0), "between 0 and 1"),
    "negative p99": (lambda d: d["tune"]["choice"].update(p99_us=-5.0), "not positive"),
    "drop of -inf": (lambda d: d["tune"]["choice"].update(drop_pct=-INF), "not a finite number"),
    "speedup not measured": (lambda d: d["tune"]["choice"].update(speedup_vs_fp32=1000.0), "speedup"),
    "choice rejected": (lambda d: _choice_row(d).update(verdict="rejected"), "did not pass"),
    "choice over its limit": (lambda d: d["tune"]["settings"].update(max_reward_drop_pct=0.0)
                              or d["tune"]["choice"].update(drop_pct=5.0) or _choice_row(d).update(drop_pct=5.0),
                              "above the limit"),
    "choice other bytes": (lambda d: d["tune"]["choice"].update(sha256=_other_sha(d["tune"]["choice"]["sha256"])),
                           "other than the one measured"),
    "shipped other bytes": (lambda d: d["tune"]["shipped"]["models"].update(
        {d["tune"]["choice"]["name"]: _other_sha(d["tune"]["choice"]["sha256"])}), "exactly the models it measured"),
    "benched another bundle": (lambda d: d["bundle"].update(manifest_sha256=_other_sha(d["bundle"]["manifest_sha256"])),
                               "not the bundle it shipped"),
    "no schema_version": (lambda d: d["tune"].pop("schema_version"), "re-run `quarl-edge tune`"),
    "no choice": (lambda d: d["tune"].update(choice=None), "no choice"),
    "threads 0": (lambda d: d["tune"]["choice"].update(threads=0), "threads"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FORGERIES))
def test_gate_refuses_a_forged_tune_json(case: str, forged: Path) -> None:
    change, words = FORGERIES[case]
    _edit(forged, change)
    with pytest.raises(InputError) as e:
        check_tune_json(forged / "tune.json")
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_gate_refuses_a_tune_json_beside_a_bundle_it_does_not_describe(
    forged: Path, cartpole_bundle: Path
) -> None:
    read = read_tune_json(forged / "tune.json")
    assert read is not None  # the untouched copy passes, its bundle beside it
    model = forged / "bundle" / next(p.name for p in (forged / "bundle").glob("policy.*"))
    model.write_bytes(model.read_bytes() + b"\0")
    with pytest.raises(InputError, match="fails its check"):
        check_tune_json(forged / "tune.json")
    shutil.rmtree(forged / "bundle")
    shutil.copytree(cartpole_bundle, forged / "bundle")  # a sound bundle, but another one
    with pytest.raises(InputError, match="is not the one it describes"):
        check_tune_json(forged / "tune.json")
    shutil.rmtree(forged / "bundle")  # tune.json alone (copied into CI): its own numbers are checked
    assert read_tune_json(forged / "tune.json") is not None


def test_the_gate_cli_refuses_a_forged_tune_json_in_one_line(cli: Any, forged: Path) -> None:
    ok = cli("gate", forged / "tune.json")
    assert ok.returncode == 0, ok.stderr
    _edit(forged, FORGERIES["choice never benched"][0])
    assert "never benched" in assert_one_error(cli("gate", forged / "tune.json"))


def test_the_typed_result_round_trips_and_checks_its_numbers(tuned: Path) -> None:
    result = read_tune_json(tuned / "tune.json")
    assert result is not None
    assert TuneResult.from_dict(result.to_dict()) == result
    row = result.row(result.reference)
    with pytest.raises(QuarlError, match="between 0 and 1"):
        replace(row, agreement=7.0)
    with pytest.raises(QuarlError, match="below p50_us"):
        replace(row, p99_us=(row.p50_us or 1) / 2, latency=((1, None),))
    c = result.choice
    assert c is not None
    with pytest.raises(QuarlError, match="other than those measured"):
        replace(result, choice=replace(c, p50_us=c.p50_us / 2))
    fast = c.p50_us / 2  # a reference faster than the choice: the choice would not have been judged
    faster_ref = replace(row, latency=((1, Timing(fast, fast)),), threads=1, p50_us=fast, p99_us=fast)
    with pytest.raises(QuarlError, match="slower than the fp32 reference"):
        replace(result, candidates=tuple(faster_ref if r is row else r for r in result.candidates))


def test_tune_limit_refusal_is_quick_and_loads_no_torch(tmp_path: Path) -> None:
    """The CLI's check runs on the light config module: importing it pulls in neither torch nor Ray."""
    code = ("import sys, quarl_edge.cli.tune, quarl_edge.tune.config, quarl_edge.tune.verify; "
            "print(sorted(m for m in ('torch', 'ray', 'tensorflow') if m in sys.modules))")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"
