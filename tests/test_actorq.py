"""ActorQ on real local Ray: int8 actors, runtime breakdown, actor failure, payload size, bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from quarl_edge.actorq import tflite  # noqa: E402
from quarl_edge.actorq.actors import ACTOR_FIELDS, LEARNER_FIELDS  # noqa: E402
from quarl_edge.actorq.broadcast import RUNTIMES, graph_name, int8_evidence, quantize_broadcast  # noqa: E402
from quarl_edge.actorq.d4pg import Actor as D4PGActor  # noqa: E402
from quarl_edge.actorq.d4pg import Args as D4PGArgs  # noqa: E402
from quarl_edge.actorq.d4pg import project, support  # noqa: E402
from quarl_edge.actorq.d4pg import train as train_d4pg  # noqa: E402
from quarl_edge.actorq.dqn import Args, QNetwork, train  # noqa: E402
from quarl_edge.actorq.result import CurvePoint, read_study  # noqa: E402
from quarl_edge.actorq.sessions import open_model  # noqa: E402
from quarl_edge.actorq.throughput import inference_throughput  # noqa: E402
from quarl_edge.runtimes.errors import InputError  # noqa: E402
from quarl_edge.study.actorq import ActorQStudyConfig, run_study, time_to_target, within_spread, write_outputs  # noqa: E402


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
            left = _ray_processes_left(d)
            assert not left, f"Ray processes left: {left}"


def _ray_processes_left(tmpdir: str) -> list[str]:
    left = subprocess.run(["pgrep", "-f", tmpdir], capture_output=True, text=True).stdout.split()
    for _ in range(20):  # workers exit asynchronously after shutdown
        if not left:
            break
        subprocess.run(["sleep", "0.5"])
        left = subprocess.run(["pgrep", "-f", tmpdir], capture_output=True, text=True).stdout.split()
    return left


def _check_breakdown(role: dict[str, Any], fields: tuple[str, ...]) -> None:
    assert set(role["seconds"]) == set(fields)
    # the parts account for the wall time; 0.1 s of slack for a sub-second run on a loaded machine, where
    # a context switch between two timed parts is a sizeable share (CI saw 0.0723 s over 0.72 s)
    assert abs(role["sum_s"] - role["wall_s"]) <= 0.1 * role["wall_s"] + 0.1


@pytest.mark.slow
def test_int8_actors_run_int8_and_breakdown_adds_up(local_ray: str, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def inspect(steps: int, actors: list[Any]) -> None:
        if steps >= 1500 and "info" not in seen:
            seen["info"] = ray.get([a.inspect.remote() for a in actors])

    args = Args(
        out=tmp_path, steps=2500, actors=2, actor_precision="int8", learning_starts=500, update_period=50
    )
    log = train(args, on_chunk=inspect).to_dict()  # the log as log.json holds it
    assert log["env_steps"] >= 2500 and log["learner_updates"] > 0 and log["broadcasts"] > 1
    for info in seen["info"]:
        assert info.precision == "int8"
        ev = info.evidence
        assert ev["quantize"] > 0 and ev["int8_weights"] == 3 and ev["float_weights"] == 0
    _check_breakdown(log["breakdown"]["learner"], LEARNER_FIELDS)
    actors = [v for k, v in log["breakdown"].items() if k.startswith("actor")]
    assert len(actors) == 2
    for a in actors:
        _check_breakdown(a, ACTOR_FIELDS)
        assert a["seconds"]["inference"] > 0 and a["seconds"]["weight_pull"] > 0
    assert log["curve"] and {"wall_s", "env_steps", "return"} <= set(log["curve"][0])
    tp = log["inference_throughput"]
    assert set(tp["calls_per_s"]) == {"fp32", "int8"}
    assert tp["ratio_vs_fp32"]["int8/fp32"] == pytest.approx(
        tp["calls_per_s"]["int8"] / tp["calls_per_s"]["fp32"]
    )
    for name in ("log.json", "breakdown.png", "curve.png", "checkpoint/state.json", "checkpoint/model.npz",
                 "checkpoint/model.json", "checkpoint/replay.npz"):  # fmt: skip
        assert (tmp_path / name).is_file(), name
    assert not (tmp_path / "checkpoint" / "model.pt").exists()
    # resume: the checkpoint's step count, update count and curve carry over
    log2 = train(dataclasses.replace(args, steps=2500 + 640, resume=True)).to_dict()
    resumed = log2["events"][0]
    assert resumed["event"] == "resumed" and resumed["env_steps"] == log["env_steps"]
    assert 3100 <= log2["env_steps"] <= 2500 + 640 + 2 * 64  # steps is the total, not more after the resume
    assert log2["learner_updates"] > log["learner_updates"]
    assert log2["curve"][: len(log["curve"])] == log["curve"]
    # wall time continues from the checkpoint's (a time to target spans both parts of a resumed run)
    assert resumed["wall_s"] >= log["curve"][-1]["wall_s"]
    assert all(p["wall_s"] >= resumed["wall_s"] for p in log2["curve"][len(log["curve"]) :])


@pytest.mark.slow
def test_killed_actor_is_replaced_and_training_continues(local_ray: str, tmp_path: Path) -> None:
    killed: dict[str, int] = {}

    def kill(steps: int, actors: list[Any]) -> None:
        if steps >= 800 and not killed:
            ray.kill(actors[0])
            killed["at"] = steps

    log = train(Args(out=tmp_path, steps=3000, actors=2, learning_starts=500), on_chunk=kill).to_dict()
    events = [e["event"] for e in log["events"]]
    assert "actor_died" in events
    assert events.count("actor_started") == 3  # two at start, one replacement
    died = next(e for e in log["events"] if e["event"] == "actor_died")
    assert log["env_steps"] >= 3000 - 64 and log["env_steps"] > died["env_steps"] + 1000
    assert "actor2" in log["breakdown"] and log["breakdown"]["actor2"]["seconds"]["env_step"] > 0


def _fill(replay: Any, n: int, rng: np.random.Generator) -> None:
    batch = {}
    for k in replay.arrays():
        full = getattr(replay, k)
        if full.dtype == np.int64:
            batch[k] = rng.integers(0, 2, n)
        else:
            batch[k] = rng.standard_normal((n, *full.shape[1:])).astype(np.float32)
    replay.add_batch(batch)


@pytest.mark.parametrize("algo", ["dqn", "d4pg"])
def test_checkpoint_restores_every_tensor_exactly(tmp_path: Path, algo: str) -> None:
    import dataclasses

    import gymnasium as gym
    import torch

    from quarl_edge.actorq import checkpoint, d4pg, dqn
    from quarl_edge.runtimes.errors import InputError

    def make(a: Any) -> Any:
        if algo == "dqn":
            return dqn.DQNLearner(a, 4, gym.spaces.Discrete(2))
        return d4pg.D4PGLearner(a, 3, gym.spaces.Box(-2.0, 2.0, (1,), np.float32))

    args: Any = (dqn.Args if algo == "dqn" else D4PGArgs)(out=tmp_path, hidden=(16, 16), batch_size=8)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    learner = make(args)
    _fill(learner.replay, 50, rng)
    for n in range(1, 4):
        learner.update(learner.replay.sample(8, rng), n)
    state = checkpoint.LearnerState(global_step=1234, updates=3, version_broadcast=0)
    ckpt = tmp_path / "checkpoint"
    checkpoint.save(ckpt, learner.parts(), learner.replay.arrays(), state)
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.json", "model.npz", "replay.npz", "state.json"]

    torch.manual_seed(1)  # different initial weights, empty optimizers
    fresh = make(args)
    got_state, replay = checkpoint.load(ckpt, fresh.parts())
    fresh.replay.add_batch(replay)
    assert got_state == state
    for name, part in learner.parts().items():
        want, got = part.state_dict(), fresh.parts()[name].state_dict()
        if isinstance(part, torch.optim.Optimizer):
            assert got["param_groups"] == want["param_groups"]  # betas come back as a tuple
            assert want["state"] and set(got["state"]) == set(want["state"])
            pairs = [
                (f"{i}/{k}", v, got["state"][i][k]) for i, s in want["state"].items() for k, v in s.items()
            ]
            assert {k.split("/")[1] for k, _, _ in pairs} == {"step", "exp_avg", "exp_avg_sq"}
        else:
            assert list(got) == list(want)
            pairs = [(k, v, got[k]) for k, v in want.items()]
        for key, w, g in pairs:
            assert g.dtype == w.dtype and torch.equal(g, w), (name, key)
    want_rb = learner.replay.arrays()
    assert all(np.array_equal(fresh.replay.arrays()[k], v) for k, v in want_rb.items())
    # the restored learner continues exactly: one more update gives bit-identical weights
    batch = learner.replay.sample(8, np.random.default_rng(5))
    learner.update(batch, 4)
    fresh.update(batch, 4)
    for name, part in learner.parts().items():
        if isinstance(part, torch.nn.Module):
            for k, v in part.state_dict().items():
                assert torch.equal(v, fresh.parts()[name].state_dict()[k]), (name, k)
    with pytest.raises(InputError, match="does not fit"):
        checkpoint.load(ckpt, make(dataclasses.replace(args, hidden=(8,))).parts())


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_int8_broadcast_payload_is_3x_smaller(runtime: str) -> None:
    q = QNetwork(4, 2, (256, 256))
    obs = np.random.default_rng(0).standard_normal((128, 4)).astype(np.float32)
    fp32 = quantize_broadcast(q.state_dict(), "fp32", None, 0, runtime=runtime)
    fp16 = quantize_broadcast(q.state_dict(), "fp16", None, 0, runtime=runtime)
    int8 = quantize_broadcast(q.state_dict(), "int8", obs, 0, runtime=runtime)
    assert fp32.nbytes >= 3 * int8.nbytes and fp32.nbytes >= 1.8 * fp16.nbytes
    assert int8.runtime == runtime and graph_name(runtime, int8.model) == "qnet"
    ev = int8_evidence(runtime, int8.model)
    assert (
        ev["quantize"] >= 1 and ev["dequantize"] >= 1 and ev["int8_weights"] == 3 and ev["float_weights"] == 0
    )
    for other in (fp32, fp16):
        assert int8_evidence(runtime, other.model) == {"quantize": 0, "dequantize": 0, "int8_weights": 0,
                                                       "float_weights": 3}  # fmt: skip


@pytest.mark.parametrize(
    "flags",
    [
        ["--actors", "0"],
        ["--actor-precision", "int4"],
        ["--actor-runtime", "tensorrt"],
        ["--algo", "d4pg"],  # CartPole has discrete actions
        ["--algo", "a3c"],
        ["--hidden", "64,x"],
        ["--hidden", "64,0"],
        ["--update-period", "0"],
        ["--env", "Pendulum-v1"],
        ["--critic-hidden", "64,64"],  # dqn has no critic
        ["--algo", "d4pg", "--env", "Pendulum-v1", "--critic-hidden", "64,0"],
    ],
)
def test_bad_input_is_one_line_exit_2(cli: Any, tmp_path: Path, flags: list[str]) -> None:
    args = ["actorq", "--env", "CartPole-v1", "--out", tmp_path / "o", *flags]
    r = cli(*args, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("runtime", ["onnx", "litert", "auto"])
def test_d4pg_pendulum_int8_actors(local_ray: str, tmp_path: Path, runtime: str) -> None:
    seen: dict[str, Any] = {}

    def inspect(steps: int, actors: list[Any]) -> None:
        if steps >= 900 and "info" not in seen:
            seen["info"] = ray.get([a.inspect.remote() for a in actors])

    args = D4PGArgs(out=tmp_path, steps=1200, actors=2, actor_precision="int8", learning_starts=400,
                    update_period=50, hidden=(64, 64), batch_size=64, train_frequency=8, n_step=3,
                    actor_runtime=runtime)  # fmt: skip
    log = train_d4pg(args, on_chunk=inspect).to_dict()
    assert log["env_steps"] >= 1200 and log["learner_updates"] > 0 and log["broadcasts"] > 1
    assert all(np.isfinite(v) for v in log["losses"].values())
    chosen = log["actor_runtime"]["chosen"]
    if runtime == "auto":  # both timed in a live actor, the faster kept
        assert set(log["actor_runtime"]["calls_per_s"]) == set(RUNTIMES)
        speeds = log["actor_runtime"]["calls_per_s"]
        assert speeds[chosen] == max(speeds.values())
    else:
        assert chosen == runtime
    assert log["inference_throughput"]["runtime"] == chosen
    for info in seen["info"]:
        assert info.precision == "int8" and info.graph == "actor" and info.runtime == chosen
        ev = info.evidence
        assert ev["quantize"] > 0 and ev["int8_weights"] == 3 and ev["float_weights"] == 0
    _check_breakdown(log["breakdown"]["learner"], LEARNER_FIELDS)
    actors = [v for k, v in log["breakdown"].items() if k.startswith("actor")]
    assert len(actors) == 2
    for a in actors:
        _check_breakdown(a, ACTOR_FIELDS)
    assert len(log["curve"]) >= 4 and all(
        -3300 < p["return"] <= 0 for p in log["curve"]
    )  # 200 steps of cost <= 16.3
    tp = log["inference_throughput"]
    assert tp["ratio_vs_fp32"]["int8/fp32"] == pytest.approx(
        tp["calls_per_s"]["int8"] / tp["calls_per_s"]["fp32"]
    )
    assert (tmp_path / "checkpoint" / "state.json").is_file() and (tmp_path / "breakdown.png").is_file()


def _actor_outputs(runtime: str, model: bytes, obs: np.ndarray) -> np.ndarray:
    run = open_model(runtime, model)
    return np.concatenate([run(np.ascontiguousarray(o.reshape(1, -1))) for o in obs])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_continuous_actor_graph_matches_torch_and_int8_is_close(runtime: str) -> None:
    import torch

    low, high = np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32)
    actor = D4PGActor(3, low, high, (32, 32))
    obs = np.random.default_rng(0).standard_normal((256, 3)).astype(np.float32)
    want = actor(torch.from_numpy(obs)).detach().numpy()
    for precision, tol in (("fp32", 1e-5), ("fp16", 1e-2), ("int8", 0.15)):
        payload = quantize_broadcast(actor.mlp_state(), precision, obs, 0, actor.squash(), runtime)
        got = _actor_outputs(runtime, payload.model, obs)
        assert np.abs(got - want).max() <= tol * 2, precision
        assert (got >= low - 1e-3).all() and (got <= high + 1e-3).all()
    # the same check catches an int8 actor calibrated on the wrong range (its activations saturate)
    bad = quantize_broadcast(actor.mlp_state(), "int8", obs * 0.01, 0, actor.squash(), runtime)
    assert np.abs(_actor_outputs(runtime, bad.model, obs) - want).max() > 0.3


def test_litert_int8_needs_calibration_and_unknown_runtime_is_one_line() -> None:
    from quarl_edge.actorq.broadcast import mlp_layers
    from quarl_edge.actorq.sessions import check_runtime

    layers = mlp_layers(QNetwork(4, 2, (8,)).state_dict())
    with pytest.raises(ValueError, match="calibration"):
        tflite.mlp_tflite(layers, "int8", None, None)
    with pytest.raises(InputError, match="unknown --actor-runtime 'tensorrt'"):
        check_runtime("tensorrt")


def test_categorical_projection_keeps_mass_and_mean() -> None:
    import torch

    support = torch.linspace(-10, 10, 21)
    probs = torch.softmax(torch.randn(5, 21), 1)
    rewards, discounts = torch.tensor([0.0, 0.5, -0.7, 100.0, 0.3]), torch.tensor([1.0, 0.9, 0.5, 0.9, 0.0])
    out = project(probs, rewards, discounts, support)
    assert torch.allclose(out.sum(1), torch.ones(5), atol=1e-5)
    mean_in = rewards + discounts * (probs * support).sum(1)
    mean_out = (out * support).sum(1)
    assert torch.allclose(mean_in[[0, 1, 2, 4]], mean_out[[0, 1, 2, 4]], atol=1e-4)  # 100 clips at v_max
    assert torch.isclose(mean_out[3], torch.tensor(10.0))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_throughput_reports_int8_over_fp32_ratio(runtime: str) -> None:
    q = QNetwork(4, 2, (64, 64))
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    precisions = ("fp32", "fp16", "int8")
    models = {p: quantize_broadcast(q.state_dict(), p, obs, 0, runtime=runtime).model for p in precisions}
    tp = inference_throughput(models, obs, calls=50, rounds=2, runtimes=dict.fromkeys(precisions, runtime))
    assert set(tp.ratio_vs_fp32) == {"fp16/fp32", "int8/fp32"}
    calls = tp.calls_per_s
    assert all(v > 0 for v in calls.values())  # each precision was measured
    for p in ("fp16", "int8"):  # and the ratio is the measured throughputs' quotient, side by side
        assert tp.ratio_vs_fp32[f"{p}/fp32"] == pytest.approx(calls[p] / calls["fp32"])


@pytest.mark.slow
def test_study_quick_suite(local_ray: str, tmp_path: Path) -> None:
    study = run_study(ActorQStudyConfig("quick", tmp_path), progress=lambda _: None)
    assert len(study.runs) == 6  # fp32/fp16/int8 at two update periods, one seed
    assert {r.precision for r in study.rows} == {"fp32", "fp16", "int8"}
    assert all(r.final_return_mean is not None for r in study.rows)
    files = write_outputs(study, tmp_path)
    assert {f.name for f in files} == {
        "actorq.json", "actorq.md", "breakdown-CartPole-v1-dqn-120x84.png", "curves-CartPole-v1-dqn-120x84.png"
    }  # fmt: skip
    md = (tmp_path / "actorq.md").read_text()
    assert "| CartPole-v1 dqn 120x84 | int8 |" in md and "energy fp32/this (paper, int8: 1.9x-3.8x)" in md
    assert all(r.energy is not None and r.energy.cpu_s["learner"] > 0 for r in study.runs)
    assert read_study(tmp_path / "actorq.json") == study  # what was written reads back as the same study
    # a second run over the same folder reuses the six finished runs instead of training again
    again = run_study(ActorQStudyConfig("quick", tmp_path), progress=lambda _: None)
    assert [r.final_return for r in again.runs] == [r.final_return for r in study.runs]
    # --finished-only with one run's log gone: the other five, that one listed as not run, nothing trained
    gone = next((tmp_path / "runs").glob("*-int8-u50-s0"))
    (gone / "log.json").unlink()
    part = run_study(ActorQStudyConfig("quick", tmp_path, finished_only=True), progress=lambda _: None)
    assert len(part.runs) == 5 and part.not_run == (gone.name,) and not (gone / "log.json").exists()
    rows = [(r.update_period, r.precision) for r in part.rows]
    assert (50, "int8") not in rows and len(rows) == 5  # the row of the run not yet made is left out


def test_finished_only_on_an_empty_folder_trains_nothing_and_says_what_is_missing(tmp_path: Path) -> None:
    study = run_study(ActorQStudyConfig("quick", tmp_path, finished_only=True), progress=lambda _: None)
    assert study.runs == () and study.rows == () and len(study.not_run) == 6
    write_outputs(study, tmp_path)
    md = (tmp_path / "actorq.md").read_text()
    assert "Not run yet (6 of the suite's runs" in md and "CartPole-v1-dqn-120x84-int8-u500-s0" in md
    assert not (tmp_path / "runs").exists()


def test_within_spread_compares_final_returns_over_seeds() -> None:
    assert within_spread([200.0, 300.0, 250.0], [240.0, 260.0, 220.0])  # inside fp32's spread
    assert not within_spread([500.0, 499.0, 500.0], [100.0, 120.0, 90.0])  # far apart, tight seeds
    assert within_spread([], [1.0]) is None and within_spread([5.0], [9.0]) is None  # no spread with 1 seed


def test_time_to_target_uses_the_rolling_mean() -> None:
    curve = [CurvePoint(wall_s=float(i), env_steps=i, ret=float(r), length=1, actor=0)
             for i, r in enumerate([10, 10, 50, 50, 50, 50, 50, 50, 50, 50, 50])]  # fmt: skip
    assert time_to_target(curve, 40.0) == 9.0  # the first full window of 10 (mean 42)
    assert time_to_target(curve, 45.0) == 10.0  # the next (mean 46)
    assert time_to_target(curve, 60.0) is None


def test_study_unknown_suite_is_one_line_exit_2(cli: Any, tmp_path: Path) -> None:
    r = cli("study", "actorq", "--suite", "huge", "--out", tmp_path / "o", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and "quick" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_d4pg_with_hidden_prints_json_with_throughput(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    with tempfile.TemporaryDirectory(prefix="aq", dir="/tmp") as d:
        monkeypatch.setenv("RAY_TMPDIR", d)
        r = cli("actorq", "--env", "Pendulum-v1", "--algo", "d4pg", "--hidden", "32,32", "--actors", "1",
                "--steps", "256", "--out", tmp_path / "o", "--json", timeout=300)  # fmt: skip
        assert r.returncode == 0, r.stderr
        log = json.loads(r.stdout)
        assert log["args"]["hidden"] == [32, 32] and log["args"]["algo"] == "d4pg" and log["env_steps"] >= 256
        tp = log["inference_throughput"]
        assert tp["ratio_vs_fp32"]["int8/fp32"] == pytest.approx(
            tp["calls_per_s"]["int8"] / tp["calls_per_s"]["fp32"]
        )
        assert not _ray_processes_left(d)


def test_d4pg_value_support_is_set_known_or_estimated() -> None:
    assert support(D4PGArgs(env="Pendulum-v1")) == (-1000.0, 0.0, "known task")
    assert support(D4PGArgs(env="Pendulum-v1", v_min=-5.0, v_max=5.0)) == (-5.0, 5.0, "set")
    assert support(D4PGArgs(env="HalfCheetah-v5"))[1] > 0  # positive returns: [-1000, 0] would not fit
    assert support(D4PGArgs(env="MountainCarContinuous-v0"))[:2] == (-100.0, 100.0)
    # a task with no entry: estimated from random actions (Pendulum registered under another name)
    import gymnasium as gym

    if "quarl-test/Swing-v0" not in gym.registry:
        gym.register("quarl-test/Swing-v0", entry_point="gymnasium.envs.classic_control:PendulumEnv",
                     max_episode_steps=200)  # fmt: skip
    lo, hi, source = support(D4PGArgs(env="quarl-test/Swing-v0"))
    assert "estimated" in source and lo < -500 and hi >= 0  # random Pendulum returns reach about -700
    with pytest.raises(InputError, match="both"):
        D4PGArgs(env="Pendulum-v1", v_min=-5.0).validate()


def test_study_runs_seed_major_with_precisions_interleaved() -> None:
    from quarl_edge.study.actorq import SUITES, _order

    order = [(t.env, seed, precision) for t, seed, _, precision in _order(SUITES["dmc"])]
    assert len(order) == 27 + 9  # 3 tasks x 3 seeds x 3 precisions at 256x3, one seed at 2048x3
    assert [seed for _, seed, _ in order[:18]] == [0] * 18  # one seed of every task first
    assert [env.split("/")[1] for env, _, _ in order[:9:3]] == [
        "cartpole-balance-v0",
        "walker-stand-v0",
        "cheetah-run-v0",
    ]
    assert [p for _, _, p in order[:3]] == ["fp32", "fp16", "int8"]


def test_resume_with_other_learning_settings_is_refused(local_ray: str, tmp_path: Path) -> None:
    args = Args(out=tmp_path, steps=700, actors=1, learning_starts=300, chunk=64)
    train(args)
    with pytest.raises(InputError, match="other settings .*learning_rate"):
        train(dataclasses.replace(args, steps=900, resume=True, learning_rate=1e-2))
    log = train(
        dataclasses.replace(args, steps=900, resume=True)
    ).to_dict()  # more steps: a resume may go further
    assert log["events"][0]["event"] == "resumed" and log["env_steps"] >= 900
