"""The studies' results are typed (quarl_edge/study/result.py): the committed tables under docs/results/ load
through the types and write back the same JSON, and a number outside its meaning is refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quarl_edge.runtimes.errors import InputError
from quarl_edge.study._common import Row
from quarl_edge.study.result import PTQStudy, VariantResult, read_study

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
COMMITTED = sorted([*RESULTS.glob("ptq/**/ptq.json"), *RESULTS.glob("qat/*.json")])


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(RESULTS)) for p in COMMITTED])
def test_every_committed_study_loads_and_writes_back_the_same_json(path: Path) -> None:
    study = read_study(path)
    assert study.results and study.findings
    assert json.dumps(study.to_dict()) == json.dumps(json.loads(path.read_text()))


@pytest.mark.parametrize(
    ("field", "value", "expect"),
    [("agreement_pct", 150.0, "agreement_pct is 150, outside [0, 100]"), ("drop_pct", math.inf, "drop_pct is inf"),
     ("std", -1.0, "std is -1, outside >= 0"), ("drop_ci95_pct", [3.0, -3.0], "low end above its high end"),
     ("returns", [1.0, None], "returns[1] is not a number")],
)  # fmt: skip
def test_a_study_row_outside_its_meaning_is_refused(
    tmp_path: Path, field: str, value: object, expect: str
) -> None:
    doc = json.loads((RESULTS / "ptq" / "ptq.json").read_text())
    row = next(r for r in doc["results"] if r["variant"] == "onnx-int8" and not r["skipped"])
    row[field] = value
    (tmp_path / "ptq.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        read_study(tmp_path / "ptq.json")
    assert expect in str(e.value) and "ptq.json" in str(e.value) and "\n" not in str(e.value)


def test_a_row_measures_its_drop_with_the_one_drift_function_and_its_zero_mean_rule() -> None:
    """A zero fp32 mean return: the drop is in % of one reward unit, as bench's (stats.drift_scale)."""
    fp32, q = [-1.0, 1.0, -2.0, 2.0], [-2.0, 0.0, -3.0, 1.0]
    s = Row("p", "ALE/Pong-v5", "dqn", "onnx-int8", 8, returns=q).summary(fp32, None)
    assert isinstance(s, VariantResult) and s.drop_pct == pytest.approx(100.0)
    assert s.mean == pytest.approx(-1.0) and s.episodes == 4 and s.normalized is None
    skipped = Row("p", "ALE/Pong-v5", "dqn", "w2", 2, skipped="no env").summary(fp32, None)
    assert (
        skipped.mean is None and "mean" not in PTQStudy.__dataclass_fields__
    )  # a skipped row has no numbers


ACTORQ = sorted(RESULTS.glob("actorq/**/actorq.json"))
LOGS = sorted(RESULTS.glob("actorq/**/log.json"))


@pytest.mark.parametrize("path", ACTORQ, ids=[str(p.relative_to(RESULTS)) for p in ACTORQ])
def test_every_committed_actorq_study_loads(path: Path) -> None:
    """The current format writes back as it is; the first one (no format tag) loads with its new keys."""
    from quarl_edge.actorq.result import read_study as read_actorq

    study = read_actorq(path)
    doc = json.loads(path.read_text())
    assert len(study.runs) == len(doc["runs"]) and len(study.rows) == len(doc["rows"])
    if "format" in doc:
        assert json.dumps(study.to_dict()) == json.dumps(doc)


def test_every_committed_actorq_run_log_loads_and_writes_back_the_same_json() -> None:
    from quarl_edge.actorq.result import read_log

    assert len(LOGS) >= 30
    for path in LOGS:
        log = read_log(path)
        assert log is not None and log.curve and log.actors
        assert json.dumps(log.to_dict()) == json.dumps(json.loads(path.read_text())), path


@pytest.mark.parametrize(("edit", "expect"), [(("curve", 0, "wall_s"), "wall_s is -1, outside >= 0"),
                                              (("curve", 0, "return"), "return is not a number"),
                                              (("env_steps",), "env_steps is not an integer >= 0")])  # fmt: skip
def test_an_actorq_log_outside_its_meaning_is_refused(
    tmp_path: Path, edit: tuple[object, ...], expect: str
) -> None:
    from quarl_edge.actorq.result import read_log

    doc = json.loads(LOGS[0].read_text())
    target = doc
    for k in edit[:-1]:
        target = target[k]  # type: ignore[index]
    target[edit[-1]] = -1 if edit[-1] != "return" else "x"  # type: ignore[index]
    (tmp_path / "log.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        read_log(tmp_path / "log.json")
    assert expect in str(e.value) and "log.json" in str(e.value)
