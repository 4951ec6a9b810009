"""ActorQ on a DM Control task (Dict observations flattened by the registry) and its energy accounting."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("dm_control")

from quarl_edge.actorq.d4pg import Args, support, train  # noqa: E402
from quarl_edge.study.actorq import ActorQStudyConfig, run_study, write_outputs  # noqa: E402

TASK = "dm_control/cartpole-balance-v0"


@pytest.fixture
def one_thread_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local Ray with 2 CPUs, and one torch thread: two spin-wait on this loaded 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="aq", dir="/tmp") as d:
        monkeypatch.setenv("RAY_TMPDIR", d)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            yield
        finally:
            ray.shutdown()
            torch.set_num_threads(threads)


def test_d4pg_trains_on_dm_control_with_int8_actors(one_thread_ray: None, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def inspect(steps: int, actors: list[Any]) -> None:
        if steps >= 600 and "info" not in seen:
            seen["info"] = ray.get([a.inspect.remote() for a in actors])

    args = Args(env=TASK, out=tmp_path, steps=3000, actors=2, actor_precision="int8", learning_starts=300,
                update_period=50, hidden=(32, 32), batch_size=32, train_frequency=8, n_step=3, chunk=50,
                checkpoint_every=100_000)  # fmt: skip
    log = train(args, on_chunk=inspect).to_dict()  # the log as log.json holds it
    assert log["env_steps"] >= 3000 and log["learner_updates"] > 0 and log["broadcasts"] > 1
    assert all(np.isfinite(v) for v in log["losses"].values())
    assert log["support"]["source"].startswith("DM Control") and log["support"]["v_min"] == 0.0
    for info in seen["info"]:
        assert info.precision == "int8" and info.graph == "actor" and info.steps > 0
        ev = info.evidence  # on whichever runtime --actor-runtime auto chose (log["actor_runtime"])
        assert ev["quantize"] > 0 and ev["int8_weights"] == 3 and ev["float_weights"] == 0
    assert (tmp_path / "checkpoint" / "state.json").is_file()
    # energy: CPU seconds measured in each role's own process, joules with their source
    energy = log["energy"]
    assert set(energy["cpu_s"]) == {"learner", "actor0", "actor1"} and min(energy["cpu_s"].values()) > 0
    assert energy["cpu_s_total"] == pytest.approx(sum(energy["cpu_s"].values()))
    assert energy["source"] in ("rapl", "estimate") and energy["joules"] > 0 and energy["wall_s"] > 0
    assert (energy["assumption"] is None) == (energy["source"] == "rapl")
    for role in ("actor0", "actor1"):  # an actor's CPU cannot exceed its own wall time (one thread busy)
        assert energy["cpu_s"][role] <= 1.5 * log["breakdown"][role]["wall_s"]
    assert len(log["curve"]) >= 2 and all(0 <= p["return"] <= 1000 for p in log["curve"])  # 1000 steps
    joules = [p["energy_j"] for p in log["curve"]]
    assert joules == sorted(joules) and joules[-1] <= energy["joules"]
    # the actors sent the flattened observation: cartpole's position (3) + velocity (2), in float32
    replay = np.load(tmp_path / "checkpoint" / "replay.npz")
    assert replay["obs"].shape[1] == 5 and replay["obs"].dtype == np.float32
    assert np.isfinite(replay["obs"]).all() and replay["obs"].std(0).min() > 0


def test_dm_control_value_support_fits_its_rewards() -> None:
    assert support(Args(env=TASK)) == (0.0, 100.0, "DM Control: rewards in [0, 1] per step")


def test_unknown_dm_control_task_is_the_registry_error(cli: Any, tmp_path: Path) -> None:
    r = cli(
        "actorq", "--env", "dm_control/walker-fly-v0", "--algo", "d4pg", "--out", tmp_path / "o", timeout=120
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown DM Control task"), r.stderr
    assert "cartpole-balance" in lines[0] and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_study_dmc_quick_suite(one_thread_ray: None, tmp_path: Path) -> None:
    study = run_study(ActorQStudyConfig("dmc-quick", tmp_path), progress=lambda _: None)
    assert [r.precision for r in study.runs] == ["fp32", "fp16", "int8"]
    assert all(r.final_return is not None and r.energy is not None and r.energy.cpu_s["learner"] > 0
               for r in study.runs)  # fmt: skip
    files = write_outputs(study, tmp_path)
    label = "dm_control-cartpole-balance-v0-d4pg-32x32x32-critic-64x64x32"
    assert {f.name for f in files} >= {"actorq.md", f"breakdown-{label}.png", f"curves-{label}.png"}
    md = (tmp_path / "actorq.md").read_text()
    assert "| dm_control/cartpole-balance-v0 d4pg 32x32x32 critic-64x64x32 | int8 |" in md
    assert "Energy to target" in md and ("estimate" in md or "rapl" in md)
    log = json.loads((tmp_path / "runs" / f"{label}-int8-u100-s0" / "log.json").read_text())
    assert log["args"]["hidden"] == [32, 32, 32] and log["args"]["critic_hidden"] == [64, 64, 32]


def test_d4pg_critic_takes_its_own_widths(tmp_path: Path) -> None:
    import gymnasium as gym

    from quarl_edge.actorq.d4pg import D4PGLearner
    from quarl_edge.runtimes.errors import InputError

    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    learner = D4PGLearner(Args(out=tmp_path, hidden=(8, 8, 8), critic_hidden=(16, 16, 4)), 5, space)
    widths = lambda net: [m.out_features for m in net.network if hasattr(m, "out_features")]  # noqa: E731
    assert widths(learner.actor) == [8, 8, 8, 2] and widths(learner.critic) == [16, 16, 4, 51]
    assert widths(learner.target_critic) == widths(learner.critic)
    with pytest.raises(InputError, match="critic hidden"):
        Args(env=TASK, critic_hidden=(16, 0)).validate()
