"""Train an fp32 policy with Stable-Baselines3 and save it as a quarl-edge checkpoint.

Reads top to bottom: config, env factory, defaults, the SB3 model, the loop (with a rich progress bar
and periodic checkpoints), the deterministic evaluation, the save.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge import __version__
from quarl_edge.outputs import CHECKPOINT, claim
from quarl_edge.policy.algos import ALGOS, CONTINUOUS_ONLY, DISCRETE_ONLY
from quarl_edge.policy.format import BEST_DIR, RESUME_DIR, RESUME_FILE, SELECTION_FILE
from quarl_edge.policy.net import Policy, save_checkpoint
from quarl_edge.policy.registry import entry, env_config, resolve_id
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import QATClock
from quarl_edge.runtimes.envs import make_env, space_spec
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.runner import run_episodes
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.spec import EnvConfig
from quarl_edge.text import markup_safe
from quarl_edge.train.hyperparams import defaults
from quarl_edge.train.qat_sb3 import check_scope, clock_callback, convert_scoped
from quarl_edge.typed import build, flag, integer, items, number


@dataclass(frozen=True)
class TrainConfig:
    env: str
    """gymnasium id (built-in registry or any registered id)"""
    algo: str
    """ppo, a2c, dqn, ddpg, td3 or sac"""
    out: Path
    """checkpoint folder"""
    steps: int | None = None
    """environment steps; None takes the per-env default"""
    seed: int = 0
    model: str | None = None
    """mlp or nature_cnn; None takes the env's default"""
    net_arch: tuple[int, ...] | None = None
    """hidden layer sizes of the actor/critic MLP"""
    eval_episodes: int = 10
    checkpoint_every: int = 0
    """save an intermediate checkpoint every N steps (0: only at the end)"""
    overrides: dict[str, Any] = field(default_factory=dict)
    """extra SB3 constructor arguments"""
    resume: bool = False
    """continue from the last checkpoint's resume state in ``out/resume/`` up to ``steps``"""
    qat: QATConfig | None = None
    """quantization-aware training: fake-quantize the policy's layers after ``qat.delay`` steps"""
    keep_best: int = 0
    """evaluate N episodes at every checkpoint and end with the best-scoring weights (0: off)"""


def validate(cfg: TrainConfig) -> EnvConfig:
    """Cheap checks before any training starts; returns the env config."""
    if cfg.algo not in ALGOS:
        raise InputError(f"unknown algorithm {cfg.algo!r}", f"choose one of: {', '.join(ALGOS)}")
    if cfg.steps is not None and cfg.steps <= 0:
        raise InputError(f"--steps must be positive (got {cfg.steps})", "pass e.g. --steps 50000")
    if cfg.model not in (None, "mlp", "nature_cnn"):
        raise InputError(f"unknown model {cfg.model!r}", "choose mlp or nature_cnn")
    env_cfg = env_config(cfg.env)
    env = make_env(env_cfg)
    try:
        act = space_spec(env.action_space)
        obs = space_spec(env.observation_space)
    finally:
        env.close()
    if act.is_discrete and cfg.algo in CONTINUOUS_ONLY:
        raise InputError(
            f"{cfg.algo.upper()} needs continuous actions; {cfg.env} has discrete ones", "use ppo, a2c or dqn"
        )
    if not act.is_discrete and cfg.algo in DISCRETE_ONLY:
        raise InputError(
            f"DQN needs discrete actions; {cfg.env} has continuous ones", "use sac, td3, ddpg, ppo or a2c"
        )
    if cfg.keep_best < 0:
        raise InputError(
            f"--keep-best must be 0 or more episodes (got {cfg.keep_best})", "e.g. --keep-best 5"
        )
    if cfg.keep_best and not cfg.checkpoint_every:
        raise InputError(
            "--keep-best needs --checkpoint-every N (it scores the policy at every checkpoint)",
            "add e.g. --checkpoint-every 10000",
        )
    check_scope(cfg.qat, cfg.algo, cfg.model or entry(cfg.env).default_model)
    if cfg.model == "nature_cnn" and not obs.is_image:
        raise InputError(
            f"the Nature-CNN needs image observations; {cfg.env} has {list(obs.shape)}", "use --model mlp"
        )
    return env_cfg


def _make_train_env(env_cfg: EnvConfig, atari: bool) -> Any:
    from stable_baselines3.common.monitor import Monitor

    def thunk() -> Any:
        env: Any = Monitor(make_env(env_cfg))
        if atari:  # reward clipping is a training aid only, not part of the deployed policy
            from gymnasium.wrappers import TransformReward

            env = TransformReward(env, lambda r: float(np.sign(float(r))))
        return env

    return thunk


def _progress_callback(total: int, label: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from stable_baselines3.common.callbacks import BaseCallback

    class RichProgress(BaseCallback):
        def _on_training_start(self) -> None:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("return {task.fields[ret]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(
                markup_safe(label), total=total, ret="-", completed=self.model.num_timesteps
            )
            self.last_log = time.monotonic()

        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            ret = f"{np.mean([e['r'] for e in buf]):.1f}" if buf else "-"
            self.bar.update(self.task, completed=self.model.num_timesteps, ret=ret)
            if not self.bar.console.is_terminal and time.monotonic() - self.last_log > 60:
                # logs and CI have no live bar: a line a minute instead
                self.last_log = time.monotonic()
                self.bar.console.print(f"{label}: {self.model.num_timesteps}/{total} steps, return {ret}")
            return True

        def _on_training_end(self) -> None:
            self.bar.stop()

    return RichProgress()


def _checkpoint_callback(every: int, save: Any) -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class Periodic(BaseCallback):
        def _on_step(self) -> bool:
            if every and self.model.num_timesteps % every < self.model.n_envs:
                save(self.model, final=False)
            return True

    return Periodic()


def resume_path(out: Path) -> Path:
    # SB3's own save format (it pickles some fields); written and read only by this trainer, to resume.
    return out / RESUME_DIR / RESUME_FILE


def _build_model(cfg: TrainConfig, env_cfg: EnvConfig, hp: dict[str, Any]) -> Any:
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

    hp = dict(hp)
    n_envs = int(hp.pop("n_envs", 1))
    hp.pop("steps", None)
    noise = hp.pop("action_noise", None)
    ou = bool(hp.pop("ou_noise", False))
    model_kind = cfg.model or entry(cfg.env).default_model
    venv = make_vec_env(_make_train_env(env_cfg, env_cfg.family == "atari"), n_envs=n_envs, seed=cfg.seed)
    if noise is not None and cfg.algo in ("td3", "ddpg", "sac"):
        dim = int(np.prod(venv.action_space.shape or ()))
        cls = OrnsteinUhlenbeckActionNoise if ou else NormalActionNoise
        hp["action_noise"] = cls(mean=np.zeros(dim), sigma=float(noise) * np.ones(dim))
    policy_kwargs = dict(hp.pop("policy_kwargs", {}))
    if cfg.net_arch is not None:
        policy_kwargs["net_arch"] = list(cfg.net_arch)
    hp.update(cfg.overrides)
    algo_cls = getattr(sb3, cfg.algo.upper())
    if cfg.resume:
        model = algo_cls.load(resume_path(cfg.out), env=venv, device="cpu")
        if hasattr(model, "learning_starts"):
            # The replay buffer is not saved (Pong's would be GBs), so refill it as a fresh run does before
            # updates resume. With a 10k-step refill, a Pong DQN fell from +7.6 (1.2M steps) to about 0
            # over the 300k steps after two resumes; updates on a nearly empty buffer are the suspect.
            model.learning_starts = model.num_timesteps + int(hp.get("learning_starts", 100))
        return model
    policy = "CnnPolicy" if model_kind == "nature_cnn" else "MlpPolicy"
    try:
        return algo_cls(
            policy, venv, seed=cfg.seed, policy_kwargs=policy_kwargs or None, verbose=0, device="cpu", **hp
        )
    except TypeError as e:
        raise InputError(
            f"bad hyperparameter for {cfg.algo.upper()}: {e}",
            "check the hyperparameter defaults in quarl_edge/train/hyperparams.py",
        ) from None


SELECT_SEED0 = 20_000  # --keep-best scores on its own seeds, not on the final evaluation's (10_000+)


@dataclass(frozen=True)
class Score:
    """One ``--keep-best`` evaluation: the weights' step and their return over the selection episodes."""

    step: int
    mean: float
    std: float
    kept: bool | None = None
    """in the selection history: whether these weights became the best (None: the final weights' score)"""

    def __post_init__(self) -> None:
        integer(self.step, "step")
        number(self.mean, "mean")
        number(self.std, "std", lo=0)
        if self.kept is not None:
            flag(self.kept, "kept")

    def to_dict(self) -> JSONObject:
        d: JSONObject = {"step": self.step, "mean": self.mean, "std": self.std}
        return d if self.kept is None else {**d, "kept": self.kept}

    @classmethod
    def from_dict(cls, v: object, name: str) -> Score:
        return build(cls, v, name)


class BestKeeper:
    """``--keep-best``: scores each checkpoint over a few deterministic episodes on selection seeds,
    keeps the best-scoring one in ``out/best/`` (history in ``out/selection.json``; both survive
    ``--resume``) and at the end hands back whichever of best and final scored higher."""

    def __init__(self, out: Path, episodes: int) -> None:
        import json

        self.out, self.episodes = out, episodes
        path = out / SELECTION_FILE
        self.history: list[Score] = []
        if path.is_file():
            try:
                history = items(json.loads(path.read_text())["history"], "history")
                self.history = [Score.from_dict(h, f"history[{i}]") for i, h in enumerate(history)]
            except (ValueError, KeyError, TypeError):
                raise InputError(
                    f"{str(path)!r} is damaged",
                    f"delete it and {BEST_DIR}/ to restart the --keep-best selection",
                ) from None

    def best(self) -> Score | None:
        kept = [h for h in self.history if h.kept]
        return kept[-1] if kept else None

    def score(self, policy: Policy) -> Score:
        mean, std, _ = evaluate(policy, self.episodes, seed0=SELECT_SEED0)
        return Score(int(policy.spec.train["steps"]), round(mean, 3), round(std, 3))

    def offer(self, policy: Policy) -> None:
        from quarl_edge.policy.net import save_checkpoint
        from quarl_edge.runtimes.fsutil import atomic_write_json

        rec = self.score(policy)
        best = self.best()
        rec = replace(rec, kept=best is None or rec.mean >= best.mean)  # ties: the later, longer-trained one
        if rec.kept:
            save_checkpoint(policy, self.out / BEST_DIR)
        self.history.append(rec)
        atomic_write_json(self.out / SELECTION_FILE, {"episodes": self.episodes, "seed0": SELECT_SEED0,
                                                      "history": [h.to_dict() for h in self.history]})  # fmt: skip

    def final(self, policy: Policy) -> Policy:
        """The better of the final policy and the kept best; its train info says which and why."""
        from quarl_edge.policy.net import load_checkpoint

        rec = self.score(policy)
        best = self.best()
        info = {"episodes": self.episodes, "seed0": SELECT_SEED0, "final": rec.to_dict(),
                "best": None if best is None else best.to_dict()}  # fmt: skip
        chosen = policy
        if best is not None and best.mean > rec.mean and (self.out / BEST_DIR).is_dir():
            kept = load_checkpoint(self.out / BEST_DIR)
            chosen = Policy(kept.spec, kept.arch, kept.net, policy.extra)
        train = {**policy.spec.train, "selected_step": int(chosen.spec.train["steps"]), "selection": info}
        train.pop("partial", None)
        return with_train(chosen, train)


def with_train(policy: Policy, train: dict[str, Any]) -> Policy:
    import dataclasses

    return Policy(dataclasses.replace(policy.spec, train=train), policy.arch, policy.net, policy.extra)


def summary_lines(policy: Policy, out: Path) -> list[str]:
    """What `quarl-edge train` says when it is done: the kept step (--keep-best) and the final return."""
    t = policy.spec.train
    lines = []
    if "selection" in t:
        sel = t["selection"]
        lines.append(f"--keep-best: final weights scored {sel['final']['mean']:.1f}, best checkpoint "
                     f"{(sel['best'] or {}).get('mean', float('nan')):.1f}; kept step {t['selected_step']}")  # fmt: skip
    lines.append(f"saved {out} ({t.get('steps')} steps, {t.get('wall_s')} s); return "
                 f"{t.get('eval_return_mean', float('nan')):.1f} ± {t.get('eval_return_std', float('nan')):.1f}")  # fmt: skip
    return lines


def evaluate(policy: Policy, episodes: int, seed0: int = 10_000) -> tuple[float, float, list[float]]:
    """Deterministic returns of the torch policy on seeds seed0, seed0+1, ..."""
    env = make_env(policy.spec.env)
    try:
        returns = [e.ret for e in run_episodes(env, policy.act, range(seed0, seed0 + episodes), catch=False)]
    finally:
        env.close()
    return float(np.mean(returns)), float(np.std(returns)), returns


def train(cfg: TrainConfig) -> Policy:
    import stable_baselines3 as sb3
    from stable_baselines3.common.logger import Logger

    from quarl_edge.policy.sb3 import base_spec, parts_from_model, policy_from_parts

    env_cfg = validate(cfg)
    claim(cfg.out, CHECKPOINT)  # before hours of training: an existing --out must be a checkpoint
    if cfg.resume and not resume_path(cfg.out).is_file():
        raise InputError(
            f"nothing to resume in {str(cfg.out)!r} (no {RESUME_DIR}/{RESUME_FILE})",
            "train without --resume, with --checkpoint-every N so it can be resumed later",
        )
    env_id = resolve_id(cfg.env)
    hp = defaults(env_id, env_cfg.family, cfg.algo)
    steps = int(cfg.steps or hp["steps"])
    model = _build_model(cfg, env_cfg, hp)
    clock = QATClock(cfg.qat.delay) if cfg.qat else None
    qat_info = None
    if cfg.qat and clock is not None:
        # in place: the optimizers keep their parameters; unsupported layers are refused before training
        n_layers = convert_scoped(model, cfg.algo, cfg.qat, clock)
        clock.step = int(model.num_timesteps)
        qat_info = replace(cfg.qat, layers=n_layers)
    base = base_spec(env_id, cfg.algo, name=cfg.out.name, source="quarl-edge train")
    t0 = time.time()

    def to_policy(m: Any, **train_info: Any) -> Policy:
        info = {
            "steps": int(m.num_timesteps),
            "requested_steps": steps,
            "seed": cfg.seed,
            "hyperparams": {
                k: (v if isinstance(v, (int, float, str, bool, list, dict)) else str(v))
                for k, v in hp.items()
            },
            "sb3_version": sb3.__version__,
            **({"checkpoint_every": cfg.checkpoint_every} if cfg.checkpoint_every else {}),
            **({"keep_best": cfg.keep_best} if cfg.keep_best else {}),
            "quarl_edge_version": __version__,
            **train_info,
        }
        if qat_info:
            info["qat"] = {**qat_info.to_dict(), "active": bool(clock and clock.active)}
        return policy_from_parts(parts_from_model(m, cfg.algo, qat=qat_info), base, extra_train=info)

    def save_resume(m: Any) -> None:
        tmp = resume_path(cfg.out).with_suffix(".tmp.zip")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        m.save(tmp)
        os.replace(tmp, resume_path(cfg.out))

    keeper = BestKeeper(cfg.out, cfg.keep_best) if cfg.keep_best else None
    keep = (RESUME_DIR, BEST_DIR, SELECTION_FILE)

    def save(m: Any, final: bool) -> None:
        if not final:
            partial = to_policy(m, partial=True, wall_s=round(time.time() - t0, 1))
            if keeper is not None:
                keeper.offer(partial)
            save_checkpoint(partial, cfg.out, keep=keep)
            save_resume(m)

    callbacks = [_progress_callback(steps, f"{cfg.algo.upper()} {env_id}")]
    if clock is not None:
        callbacks.append(clock_callback(clock))
    if cfg.checkpoint_every:
        callbacks.append(_checkpoint_callback(cfg.checkpoint_every, save))
    remaining = steps - int(model.num_timesteps)
    # SB3's own logger (verbose=0, no tensorboard) would make an empty /tmp/SB3-<time> folder per learn()
    model.set_logger(Logger(None, []))
    if remaining > 0:
        model.learn(total_timesteps=remaining, callback=callbacks, reset_num_timesteps=not cfg.resume)
    wall = time.time() - t0
    policy = to_policy(model, wall_s=round(wall, 1))
    if keeper is not None:
        policy = keeper.final(policy)
    if cfg.eval_episodes > 0:
        mean, std, _ = evaluate(policy, cfg.eval_episodes)
        policy = with_train(policy, {**policy.spec.train, "eval_return_mean": mean, "eval_return_std": std,
                                     "eval_episodes": cfg.eval_episodes})  # fmt: skip
    save_checkpoint(policy, cfg.out, keep=keep)
    if cfg.checkpoint_every:
        save_resume(model)
    return policy
