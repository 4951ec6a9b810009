"""Property-based fuzzing of what tune reads back: its cache (``.cache/state.json`` and the cached candidates
bundle), tune.json (what `gate` reads) and the ``--out`` folder. Mutations as in tests/test_fuzz.py (a
value anywhere replaced by another type, an absurd number, hostile text, deep nesting, or deleted).

The contract: a damaged or forged cache entry is never reused (the cache answers with a measurement only
for the entry's own model bytes, and only a sound one) and never fatal; a tune over a damaged cache
finishes and ships what it measured; a forged tune.json is accepted by gate's reader only when what it
certifies holds (its choice benched, the bundle beside it the one it names), else one QuarlError line;
an --out is accepted only when everything in it is tune's."""

from __future__ import annotations

import copy
import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz import contract, dumps, fuzz_settings, mutations
from test_tune_inputs import small
from test_tune_trust import assert_ships_what_it_measured

from quarl_edge.bench.report import read_report
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.tune.cache import STAGES, State
from quarl_edge.tune.outdir import OUTPUTS, _leftover, check_out
from quarl_edge.tune.records import Drift, Timing
from quarl_edge.tune.search import run_tune
from quarl_edge.tune.verify import read_tune_json

pytestmark = pytest.mark.slow  # one real tune (~20 s), then the cases; the whole-tune cases ~5 s each


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path) -> Path:
    out = tmp_path_factory.mktemp("fuzz-tune") / "t"
    run_tune(small(cartpole_policy, out, cartpole_calib))
    return out


@pytest.fixture
def case_dir(tmp_path: Path) -> Callable[[], Path]:
    """A fresh folder per hypothesis example (tmp_path is one per test)."""
    count = itertools.count()

    def new() -> Path:
        d = tmp_path / f"case{next(count)}"
        d.mkdir()
        return d

    return new


def _valid(stage: str, value: Any) -> bool:
    """A value the cache hands out is typed (its records check their numbers when made)."""
    if stage in ("layers", "screen"):
        return isinstance(value, float) and 0.0 <= value <= 1.0
    return isinstance(value, Timing if stage == "latency" else Drift)


def test_a_fuzzed_cache_answers_only_for_its_own_bytes_and_only_soundly(
    request: pytest.FixtureRequest, tuned: Path, case_dir: Callable[[], Path]
) -> None:
    doc = json.loads((tuned / ".cache" / "state.json").read_text())
    asked = [(s, n, e["model"]) for s in STAGES for n, e in (doc.get(s) or {}).items()]
    assert asked

    @fuzz_settings(request)
    @given(mutations(doc), st.booleans())
    def run(mutated: Any, forge_model: bool) -> None:
        path = case_dir() / "state.json"
        path.write_text(dumps(mutated))
        lines: list[str] = []

        def use() -> None:
            state = State(path, doc["key"], doc["inputs"], lines.append)
            for stage, name, model in asked:
                wanted = "f" * 64 if forge_model else model  # another model's bytes: never its numbers
                value = state.get(stage, name, wanted)
                if value is None:
                    continue
                entry = mutated[stage][name]
                assert not forge_model and entry["model"] == model and _valid(stage, value)
            assert (
                len(lines) <= 2
            )  # one line for a damaged cache (or one for other inputs), not one per entry

        contract("tune cache", use)

    run()


@pytest.mark.parametrize("target", ["state.json", "candidates manifest"])
def test_a_tune_over_a_fuzzed_cache_finishes_and_ships_what_it_measured(
    request: pytest.FixtureRequest, tuned: Path, case_dir: Callable[[], Path], cartpole_policy: Path,
    cartpole_calib: Path, target: str,
) -> None:  # fmt: skip
    cache = tuned / ".cache"
    bundle = next(p for p in cache.iterdir() if p.name.startswith("candidates-"))
    source = cache / "state.json" if target == "state.json" else bundle / "manifest.json"
    doc = json.loads(source.read_text())

    # a whole tune per case: a handful of cases (the cheap properties above and below take the many)
    @settings(max_examples=min(4, int(request.config.getoption("--fuzz-examples"))), deadline=None,
              derandomize=True, database=None)  # fmt: skip
    @given(mutations(doc))
    def run(mutated: Any) -> None:
        out = case_dir() / "t"
        shutil.copytree(tuned, out)
        (out / source.relative_to(tuned)).write_text(dumps(mutated))
        result = run_tune(small(cartpole_policy, out, cartpole_calib))
        assert_ships_what_it_measured(out, result)

    run()


def test_a_fuzzed_tune_json_is_accepted_only_when_what_it_certifies_holds(
    request: pytest.FixtureRequest, tuned: Path, case_dir: Callable[[], Path]
) -> None:
    doc = json.loads((tuned / "tune.json").read_text())
    shipped = {m.name: m.sha256 for m in load_manifest(tuned / "bundle").models}

    @fuzz_settings(request)
    @given(st.booleans(), mutations(doc["tune"]), mutations(doc))
    def run(block_only: bool, block: Any, whole: Any) -> None:
        out = case_dir() / "t"
        shutil.copytree(tuned, out, ignore=shutil.ignore_patterns(".cache"))
        forged = {**copy.deepcopy(doc), "tune": block} if block_only else whole
        (out / "tune.json").write_text(dumps(forged))

        def use() -> None:
            result = read_tune_json(out / "tune.json")
            if result is None:
                assert "tune" not in forged  # a plain bench report: gate's own checks apply
                return
            (report,) = read_report(out / "tune.json").reports.values()  # tune benches one device
            assert result.choice is not None and result.shipped is not None
            assert {result.choice.name, result.reference} <= {m.name for m in report.models}
            assert report.bundle.policy == result.policy
            assert dict(result.shipped.models) == shipped  # the bundle beside it is the one it names

        contract("tune.json", use)

    run()


names = st.sampled_from([*OUTPUTS, ".tune.json.123.abcdefgh.tmp", ".bundle.old-42", "notes.md", ".cache2",
                         "tune.JSON", "bundle.bak", ".tune.md.x.tmp", "💥", "lock", "state.json"])  # fmt: skip


def test_a_fuzzed_out_folder_is_accepted_only_when_everything_in_it_is_tunes(
    request: pytest.FixtureRequest, tuned: Path, case_dir: Callable[[], Path]
) -> None:
    @fuzz_settings(request)
    @given(st.lists(names, max_size=4, unique=True), st.booleans())
    def run(entries: list[str], as_dirs: bool) -> None:
        out = case_dir() / "t"
        shutil.copytree(tuned, out)
        for name in entries:
            path = out / name
            if path.exists():
                continue  # tune's own output, as tune wrote it
            if as_dirs:
                path.mkdir()
            else:
                path.write_text("x")
        cfg = small(tuned.parent / "no-such-policy", out)

        def use() -> None:
            check_out(cfg)
            assert all(e.name in OUTPUTS or _leftover(e.name) for e in out.iterdir())

        contract("tune --out", use)

    run()
