"""ActorQ on real local Ray: int8 actors, runtime breakdown, actor failure, payload size, bad input."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from quarl_edge.actorq.actors import ACTOR_FIELDS, LEARNER_FIELDS  # noqa: E402
from quarl_edge.actorq.broadcast import int8_evidence, quantize_broadcast  # noqa: E402
from quarl_edge.actorq.dqn import Args, QNetwork, train  # noqa: E402


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Local Ray with 2 CPUs under a short temp dir; afterwards no Ray process may be left in it."""
    with tempfile.TemporaryDirectory(prefix="aq", dir="/tmp") as d:
        monkeypatch.setenv("RAY_TMPDIR", d)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            yield d
        finally:
            ray.shutdown()
            left = subprocess.run(["pgrep", "-f", d], capture_output=True, text=True).stdout.split()
            for _ in range(20):  # workers exit asynchronously after shutdown
                if not left:
                    break
                subprocess.run(["sleep", "0.5"])
                left = subprocess.run(["pgrep", "-f", d], capture_output=True, text=True).stdout.split()
            assert not left, f"Ray processes left: {left}"


def _check_breakdown(role: dict[str, Any], fields: tuple[str, ...]) -> None:
    assert set(role["seconds"]) == set(fields)
    assert abs(role["sum_s"] - role["wall_s"]) <= 0.1 * role["wall_s"]


def test_int8_actors_run_int8_and_breakdown_adds_up(local_ray: str, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def inspect(steps: int, actors: list[Any]) -> None:
        if steps >= 1500 and "info" not in seen:
            seen["info"] = ray.get([a.inspect.remote() for a in actors])

    args = Args(
        out=tmp_path, steps=2500, actors=2, actor_precision="int8", learning_starts=500, update_period=50
    )
    log = train(args, on_chunk=inspect)
    assert log["env_steps"] >= 2500 and log["learner_updates"] > 0 and log["broadcasts"] > 1
    for info in seen["info"]:
        assert info["precision"] == "int8"
        ev = info["evidence"]
        assert (
            ev["QuantizeLinear"] > 0 and ev["int8_initializers"] >= 3 and ev["float_weight_initializers"] == 0
        )
    _check_breakdown(log["breakdown"]["learner"], LEARNER_FIELDS)
    actors = [v for k, v in log["breakdown"].items() if k.startswith("actor")]
    assert len(actors) == 2
    for a in actors:
        _check_breakdown(a, ACTOR_FIELDS)
        assert a["seconds"]["inference"] > 0 and a["seconds"]["weight_pull"] > 0
    assert log["curve"] and {"wall_s", "env_steps", "return"} <= set(log["curve"][0])
    for name in ("log.json", "breakdown.png", "curve.png", "checkpoint/state.json", "checkpoint/model.pt"):
        assert (tmp_path / name).is_file(), name
    # resume: the checkpoint's step count carries over
    log2 = train(Args(out=tmp_path, steps=2500 + 640, actors=2, learning_starts=500, resume=True))
    assert log2["events"][0]["event"] == "resumed" and log2["env_steps"] >= 3100


def test_killed_actor_is_replaced_and_training_continues(local_ray: str, tmp_path: Path) -> None:
    killed: dict[str, int] = {}

    def kill(steps: int, actors: list[Any]) -> None:
        if steps >= 800 and not killed:
            ray.kill(actors[0])
            killed["at"] = steps

    log = train(Args(out=tmp_path, steps=3000, actors=2, learning_starts=500), on_chunk=kill)
    events = [e["event"] for e in log["events"]]
    assert "actor_died" in events
    assert events.count("actor_started") == 3  # two at start, one replacement
    died = next(e for e in log["events"] if e["event"] == "actor_died")
    assert log["env_steps"] >= 3000 - 64 and log["env_steps"] > died["env_steps"] + 1000
    assert "actor2" in log["breakdown"] and log["breakdown"]["actor2"]["seconds"]["env_step"] > 0


def test_int8_broadcast_payload_is_3x_smaller() -> None:
    import numpy as np

    q = QNetwork(4, 2, (256, 256))
    obs = np.random.default_rng(0).standard_normal((128, 4)).astype(np.float32)
    fp32 = quantize_broadcast(q.state_dict(), "fp32", None, 0)
    int8 = quantize_broadcast(q.state_dict(), "int8", obs, 0)
    assert fp32.nbytes >= 3 * int8.nbytes
    assert int8_evidence(int8.model)["int8_initializers"] >= 3


@pytest.mark.parametrize(
    "flags",
    [
        ["--actors", "0"],
        ["--actor-precision", "int4"],
        ["--algo", "d4pg"],
        ["--update-period", "0"],
        ["--env", "Pendulum-v1"],
    ],
)
def test_bad_input_is_one_line_exit_2(cli: Any, tmp_path: Path, flags: list[str]) -> None:
    args = ["actorq", "--env", "CartPole-v1", "--out", tmp_path / "o", *flags]
    r = cli(*args, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert not (tmp_path / "o").exists()
