"""ActorQ's actor-learner loop on Ray, shared by the DQN (dqn.py) and D4PG (d4pg.py) learners.

An algorithm supplies a `Learner`: its networks and optimizers, its replay buffer, its `update` rule,
the policy it broadcasts, its Ray actor class and the exploration setting of each call. This module
owns the rest: Ray, the actor pool and the replacement of dead actors, the weight broadcasts, where the
learner's time goes (LapTimer over LEARNER_FIELDS), the learning curve, checkpoints (checkpoint.py) and
log.json / breakdown.png / curve.png. `ActorQArgs` holds the settings every learner shares.

Every `broadcast_every` learner updates the policy is quantized ONCE to the actors' precision and
`ray.put` once for all actors; each actor pulls the newest broadcast after `update_period` of its own
steps.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from quarl_edge.actorq import checkpoint
from quarl_edge.actorq.actors import LEARNER_FIELDS, Batch, LapTimer
from quarl_edge.actorq.broadcast import PRECISIONS, Squash, quantize_broadcast
from quarl_edge.actorq.energy import EnergyMeter
from quarl_edge.actorq.plots import plot_breakdown, plot_curve
from quarl_edge.actorq.result import ActorQLog, CurvePoint, RoleTime, RuntimeChoice
from quarl_edge.actorq.sessions import check_runtime
from quarl_edge.actorq.throughput import actor_throughput, choose_runtime
from quarl_edge.parallel import start_ray
from quarl_edge.policy.registry import make
from quarl_edge.runtimes.errors import InputError, MissingDependencyError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.typed import to_json

OnChunk = Callable[[int, list[Any]], None]
"""``on_chunk(env_steps, actor_handles)``: called after every received batch (tests kill actors)"""


@dataclass(frozen=True, kw_only=True)
class ActorQArgs:
    """Settings of the actor-learner loop; each learner's Args adds its own and sets the defaults left
    open here (env, out, algo, steps, hidden, batch_size, train_frequency)."""

    env: str
    """gymnasium id of the task"""
    out: Path
    """folder for log.json, breakdown.png, curve.png and checkpoint/"""
    algo: str
    """learner: dqn or d4pg"""
    actors: int = 2
    """number of Ray actors collecting experience"""
    actor_precision: str = "int8"
    """precision of the actors' policy copy: fp32, fp16 or int8"""
    actor_runtime: str = "auto"
    """what the actors run it on: onnx (ONNX Runtime; int8 = QDQ S8S8), litert (TFLite; int8 = full
    integer) or auto (both timed in a live actor at the start, the faster kept; recorded in log.json)"""
    update_period: int = 100
    """actor steps between weight pulls (an actor pulls only when a newer broadcast exists)"""
    steps: int
    """total environment steps over all actors"""
    seed: int = 0
    """seed of the learner, the actors (seed * 1000 + actor id) and their environments"""
    address: str | None = None
    """Ray cluster address; None starts a local Ray with one CPU per actor"""
    resume: bool = False
    """continue from out/checkpoint when it exists"""
    hidden: tuple[int, ...]
    """hidden layer sizes of the policy MLP"""
    batch_size: int
    """transitions per learner update"""
    learning_starts: int = 1_000
    """environment steps before the first learner update"""
    train_frequency: int
    """environment steps per learner update"""
    chunk: int = 64
    """environment steps an actor runs per Ray call (one batch of transitions)"""
    broadcast_every: int = 25
    """learner updates between weight broadcasts"""
    checkpoint_every: int = 10_000
    """environment steps between checkpoints (and one at the end)"""
    calibration_size: int = 256
    """replay observations that calibrate each int8 broadcast"""
    learner_threads: int = 1
    """torch threads of the learner: the actors have the other cores (on 2 busy cores torch's second
    thread spin-waits: a 512-wide D4PG update measured 646 ms at 2 threads vs 38 ms at 1)"""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """free-form notes copied into log.json"""

    def validate(self) -> None:
        """Raise InputError for unusable values, before Ray or any environment starts."""
        self.validate_shared()
        self.action_space()

    def validate_shared(self, positive: tuple[str, ...] = ()) -> None:
        """InputError for unusable loop settings; ``positive`` names the learner's own >= 1 fields."""
        if self.actors < 1:
            raise InputError(f"--actors must be at least 1 (got {self.actors})", "e.g. --actors 2")
        if self.actor_precision not in PRECISIONS:
            raise InputError(
                f"unknown --actor-precision {self.actor_precision!r}", f"known: {', '.join(PRECISIONS)}"
            )
        check_runtime(self.actor_runtime)
        for name in ("update_period", "steps", "chunk", "broadcast_every", "batch_size", "train_frequency",
                     "learner_threads", *positive):  # fmt: skip
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not self.hidden or min(self.hidden) < 1:
            raise InputError(
                f"hidden sizes must be positive (got {self.hidden})",
                f"e.g. --hidden {self._example('hidden')}",
            )

    def action_space(self) -> Any:
        """The task's action space; InputError when the environment cannot be made."""
        try:
            env = make(self.env)
        except QuarlError:  # the registry's own one-line errors (unknown DM Control task, missing extra)
            raise
        except Exception as e:  # gymnasium raises several types for unknown or broken ids
            raise InputError(
                f"cannot make environment {self.env!r}: {e}", f"e.g. --env {self._example('env')}"
            ) from None
        space = env.action_space
        env.close()
        return space

    def _example(self, name: str) -> str:
        """This learner's default of ``name`` as the CLI spells it, for error hints."""
        default = self.__dataclass_fields__[name].default
        return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


class Replay(Protocol):
    """A learner's replay buffer as the loop uses it."""

    obs: np.ndarray
    size: int

    def add_batch(self, b: Mapping[str, np.ndarray]) -> None:
        """Insert transitions (an actor's Batch.transitions, or a checkpoint's replay arrays)."""
        ...

    def sample(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]: ...
    def arrays(self) -> dict[str, np.ndarray]: ...


class Learner(Protocol):
    """What an algorithm gives the loop."""

    @property
    def replay(self) -> Replay: ...

    @property
    def actor_class(self) -> type:
        """The experience collector (actors.py) that ``ray.remote`` wraps."""
        ...

    def actor_args(self) -> tuple[Any, ...]:
        """The actor's constructor arguments after (env id, seed, actor id)."""
        ...

    def parts(self) -> dict[str, checkpoint.Part]:
        """Networks and optimizers by name: what a checkpoint saves and a resume restores."""
        ...

    def policy(self) -> tuple[dict[str, torch.Tensor], Squash | None]:
        """The MLP state dict to broadcast, and the (scale, bias) of a tanh-squashed continuous actor."""
        ...

    def exploration(self, env_steps: int) -> float:
        """The exploration argument of the next `collect` call (epsilon, or noise std)."""
        ...

    def update(self, batch: tuple[torch.Tensor, ...], n: int) -> None:
        """Learner update number ``n`` (from 1) on a batch sampled from the replay buffer."""
        ...

    def summary(self) -> JSONObject:
        """Extra log.json entries, placed after learner_updates."""
        ...


A = TypeVar("A", bound=ActorQArgs)
RESUME_MAY_CHANGE = ("steps", "resume", "address", "extra", "out", "checkpoint_every")
"""settings a resumed run may change: how far it goes and where it runs, not what it learns"""


def _args_json(args: ActorQArgs) -> JSONObject:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()}


def _check_resume_args(args: ActorQArgs, ckpt: Path) -> None:
    """InputError when the checkpoint was written with other learning settings than ``args``
    (checkpoints from before the settings were saved carry none and are taken as they are)."""
    saved = checkpoint.read_state(ckpt).args
    if saved is None:
        return
    now = json.loads(json.dumps(_args_json(args)))  # tuples as lists, like the saved JSON
    changed = sorted(k for k in now if k not in RESUME_MAY_CHANGE and saved.get(k) != now[k])
    if changed:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {now[k]!r}" for k in changed[:4])
        raise InputError(f"{ckpt} was written with other settings ({detail})",
                         "resume with the same settings, or give a new --out")  # fmt: skip


def run(
    args: A, make_learner: Callable[[A, int, Any], Learner], on_chunk: OnChunk | None = None
) -> ActorQLog:
    """Run ActorQ with the learner ``make_learner(args, n_obs, action_space)``; returns the log also
    written to ``args.out / 'log.json'``."""
    args.validate()
    try:
        import ray
        from ray.exceptions import RayActorError
    except ImportError:
        raise MissingDependencyError("ActorQ runs on Ray", "pip install 'quarl-edge[actorq]'") from None
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.learner_threads)
    try:
        return _run(args, make_learner, on_chunk, ray, RayActorError)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: A, make_learner: Callable[[A, int, Any], Learner], on_chunk: OnChunk | None, ray: Any,
         RayActorError: type[BaseException]) -> ActorQLog:  # fmt: skip
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    probe = make(args.env)  # the actors' preprocessing, so n_obs is what they send
    n_obs, action_space = int(np.prod(probe.observation_space.shape or (1,))), probe.action_space
    probe.close()
    learner = make_learner(args, n_obs, action_space)
    rb = learner.replay
    global_step, updates, version = 0, 0, 0
    curve: list[CurvePoint] = []
    events: list[JSONObject] = []
    resumed_choice: RuntimeChoice | None = None
    wall_before = 0.0  # a resumed run's wall seconds before its checkpoint: curve times continue from there
    ckpt = args.out / "checkpoint"
    if args.resume and (ckpt / "state.json").is_file():
        _check_resume_args(args, ckpt)
        state, replay = checkpoint.load(ckpt, learner.parts())
        rb.add_batch(replay)
        global_step, updates, version = state.global_step, state.updates, state.version_broadcast
        curve = list(state.curve)
        resumed_choice = state.actor_runtime  # the runtime auto chose before: kept for the whole run
        wall_before = state.wall_before
        events.append({"event": "resumed", "env_steps": global_step, "wall_s": round(wall_before, 3)})
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    started_ray = not ray.is_initialized()
    if started_ray:
        start_ray(args.address, args.actors)  # quarl_edge/parallel.py: without Ray's and JAX's notices
    ray_init_s = time.perf_counter() - t0
    RemoteActor: Any = ray.remote(num_cpus=1)(learner.actor_class)
    next_id = 0

    def start_actor() -> Any:
        nonlocal next_id
        handle = RemoteActor.remote(args.env, args.seed * 1000 + next_id, next_id, *learner.actor_args())
        events.append({"event": "actor_started", "actor": next_id, "env_steps": global_step})
        next_id += 1
        return handle

    def calibration() -> np.ndarray | None:
        return rb.obs[rng.integers(0, rb.size, args.calibration_size)] if rb.size else None

    runtime = args.actor_runtime

    def broadcast() -> list[Any]:
        calib = calibration()
        weights, squash = learner.policy()
        payload = quantize_broadcast(weights, args.actor_precision, calib, version, squash, runtime)
        payload_bytes.append(payload.nbytes)
        return [ray.put(payload)]  # once for all actors; the list keeps Ray from resolving it per call

    def save_checkpoint() -> None:
        state = checkpoint.LearnerState(global_step=global_step, updates=updates, version_broadcast=version,
                                        curve=tuple(curve), args=_args_json(args), actor_runtime=runtime_choice,
                                        wall_s=wall_before + time.perf_counter() - start_wall)  # fmt: skip
        checkpoint.save(ckpt, learner.parts(), rb.arrays(), state)

    payload_bytes: list[int] = []
    actor_reports: dict[int, RoleTime] = {}
    runtime_choice = resumed_choice or RuntimeChoice(runtime)
    runtime = runtime_choice.chosen
    try:
        actors = [start_actor() for _ in range(args.actors)]
        slot_ids = list(range(args.actors))
        if runtime == "auto":
            weights, squash = learner.policy()
            runtime_choice = choose_runtime(actors[0], weights, args.actor_precision, calibration(), squash)
            runtime = runtime_choice.chosen
        box = broadcast()
        timer = LapTimer(LEARNER_FIELDS)
        meter = EnergyMeter()
        joules_before = (curve[-1].energy_j or 0.0) if curve else 0.0  # a resumed run's earlier part
        start_wall = time.perf_counter()
        events.append({"event": "actor_runtime", **to_json(runtime_choice)})

        def cpu_s() -> dict[str, float]:  # per role: the learner's own, each actor's last report
            return {"learner": timer.cpu_s(), **{f"actor{k}": v.cpu_s or 0.0
                                                 for k, v in sorted(actor_reports.items())}}  # fmt: skip

        def submit(slot: int) -> Any:
            exploration = learner.exploration(global_step)
            return actors[slot].collect.remote(args.chunk, exploration, version, box, args.update_period)

        pending = {submit(s): s for s in range(args.actors)}
        submitted = global_step + args.chunk * args.actors  # `steps` counts from 0, also after a resume
        timer.lap("bookkeeping")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            timer.lap("idle")
            slot = pending.pop(ready[0])
            try:
                batch: Batch = ray.get(ready[0])
            except RayActorError as e:
                dead = slot_ids[slot]
                events.append({"event": "actor_died", "actor": dead, "env_steps": global_step,
                               "error": type(e).__name__})  # fmt: skip
                actor_reports[dead] = replace(actor_reports.get(dead, RoleTime()), died=True)
                actors[slot] = start_actor()
                slot_ids[slot] = next_id - 1
                if submitted < args.steps:
                    pending[submit(slot)] = slot
                    submitted += args.chunk
                timer.lap("bookkeeping")
                continue
            timer.lap("receive")
            rb.add_batch(batch.transitions)
            timer.lap("replay_insert")
            n_new = batch.env_steps  # D4PG's n-step transitions are not one per env step
            global_step += n_new
            wall = time.perf_counter() - start_wall
            actor_reports[batch.actor_id] = replace(batch.breakdown, version=batch.version)
            joules = meter.joules(sum(cpu_s().values()))  # so far, for the energy to a target return
            for ret, length in batch.episodes:
                curve.append(CurvePoint(wall_s=round(wall_before + wall, 4), env_steps=global_step, ret=ret,
                                        length=length, actor=batch.actor_id,
                                        energy_j=round(joules_before + joules, 3)))  # fmt: skip
            if on_chunk is not None:
                on_chunk(global_step, actors)
            timer.lap("bookkeeping")

            if global_step > args.learning_starts:
                for _ in range(n_new // args.train_frequency):
                    sample = rb.sample(args.batch_size, rng)
                    timer.lap("replay_sample")
                    updates += 1
                    learner.update(sample, updates)
                    timer.lap("learner_update")
                    if updates % args.broadcast_every == 0:
                        version += 1
                        box = broadcast()
                        timer.lap("quantize_broadcast")

            if submitted < args.steps:
                pending[submit(slot)] = slot
                submitted += args.chunk
            timer.lap("bookkeeping")
            if global_step // args.checkpoint_every != (global_step - n_new) // args.checkpoint_every:
                save_checkpoint()
                timer.lap("checkpoint")

        save_checkpoint()
        timer.lap("checkpoint")
        learner_report = timer.report()
        energy = meter.report(cpu_s(), time.perf_counter() - start_wall)
        if events and events[0]["event"] == "resumed":  # these figures cover the part since the resume
            energy = replace(energy, since_resume=True, joules_before_resume=joules_before)
        calib = calibration()
        weights, squash = learner.policy()
        throughput = actor_throughput(actors[0], weights, args.actor_precision, calib, squash, runtime)
        for a in actors:
            ray.kill(a)
    finally:
        if started_ray:
            ray.shutdown()

    weights, squash = learner.policy()
    fp32_bytes = quantize_broadcast(weights, "fp32", None, version, squash, runtime).nbytes
    log = ActorQLog(
        args=_args_json(args), env_steps=global_step, learner_updates=updates, learner=learner.summary(),
        actor_runtime=runtime_choice, broadcasts=len(payload_bytes),
        payload_bytes={args.actor_precision: payload_bytes[-1], "fp32": fp32_bytes}, startup_s={"ray_init": ray_init_s},
        inference_throughput=throughput, energy=energy,
        breakdown={"learner": learner_report, **{f"actor{k}": v for k, v in sorted(actor_reports.items())}},
        curve=tuple(curve), events=tuple(events),
    )  # fmt: skip
    atomic_write_json(args.out / "log.json", log.to_dict())
    plot_breakdown(log, args.out / "breakdown.png")
    plot_curve(log, args.out / "curve.png")
    return log
