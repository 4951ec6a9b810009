"""ActorQ's learners registered by name (dqn, d4pg): each one's Args, with its own defaults, and its train.
The CLI and the study read this one table; an unknown name lists the known ones, and a setting the
learner does not have is one line naming the flag (dqn has no critic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from quarl_edge.actorq import d4pg, dqn
from quarl_edge.actorq.loop import ActorQArgs
from quarl_edge.actorq.result import ActorQLog
from quarl_edge.runtimes.errors import InputError


@dataclass(frozen=True)
class Learner:
    args: type[ActorQArgs]
    """its settings, with its own defaults (dqn: 50,000 steps; d4pg: 20,000)"""
    train: Callable[[Any], ActorQLog]


LEARNERS: dict[str, Learner] = {"dqn": Learner(dqn.Args, dqn.train), "d4pg": Learner(d4pg.Args, d4pg.train)}


def learner(algo: str) -> Learner:
    if algo not in LEARNERS:
        raise InputError(f"unknown --algo {algo!r}", f"known: {', '.join(LEARNERS)}")
    return LEARNERS[algo]


def learner_args(algo: str, **settings: Any) -> ActorQArgs:
    """``algo``'s Args: ``settings`` over the learner's own defaults (what is not given is its own)."""
    cls = learner(algo).args
    own = {f.name for f in fields(cls)}
    for name in settings:
        if name not in own:
            others = [a for a, ln in LEARNERS.items() if name in {f.name for f in fields(ln.args)}]
            flag = f"--{name.replace('_', '-')}"
            raise InputError(f"{flag} is not a setting of --algo {algo}" + (f" (it is {others[0]}'s)" if others else ""),
                             f"drop {flag}")  # fmt: skip
    return cls(algo=algo, **settings)


def train(args: ActorQArgs) -> ActorQLog:
    """Train with ``args``' learner; the log is also written to ``args.out / 'log.json'``."""
    return learner(args.algo).train(args)
