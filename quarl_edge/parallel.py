"""Where independent jobs run (tune's probes and closed loops, the studies' evaluations): in this process
one after another (the default), in local worker processes, or as Ray tasks.

``--workers N`` asks for N side by side: as Ray tasks when Ray is installed (a local Ray of N CPUs), else,
or with ``--no-ray``, in N local processes; ``--address`` sends them to a Ray cluster. One worker (the
default) starts nothing: a 2-core laptop gains nothing from Ray's start-up (a few seconds, a dashboard-less
cluster and its notices) for a handful of jobs. ActorQ is Ray by design and starts it with
:func:`start_ray`, as the pool does: that is where Ray's and JAX's notices are silenced, each by its exact
message, never our own output.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from quarl_edge.runtimes.errors import InputError, MissingDependencyError

MAX_WORKERS = 256

Run = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]], tuple[Any, ...]], list[Any]]
"""``run(fn, calls, shared)``: ``[fn(*shared, *call) for call in calls]``, side by side where it can"""


@dataclass(frozen=True)
class Workers:
    """How many jobs run side by side, and on what (``--workers``, ``--no-ray``, ``--address``)."""

    count: int = 1
    """jobs side by side; 1: in this process, one after another"""
    ray: bool | None = None
    """None: Ray for more than one worker when it is installed; False: never (local processes)"""
    address: str | None = None
    """a Ray cluster: the jobs go there"""

    def __post_init__(self) -> None:
        if (
            isinstance(self.count, bool)
            or not isinstance(self.count, int)
            or not 1 <= self.count <= MAX_WORKERS
        ):
            raise InputError(f"--workers {self.count!r} is not a whole number in [1, {MAX_WORKERS}]",
                             "e.g. --workers 4")  # fmt: skip
        if self.address is not None and self.ray is False:
            raise InputError(
                "--address names a Ray cluster and --no-ray says not to use Ray", "drop one of them"
            )

    @property
    def backend(self) -> str:
        """``in-process``, ``processes`` or ``ray``."""
        if self.address is not None:
            return "ray"
        if self.count == 1:
            return "in-process"
        if self.ray is False or importlib.util.find_spec("ray") is None:
            return "processes"
        return "ray"

    @property
    def local(self) -> bool:
        """The jobs run on this machine (they may be handed local paths)."""
        return self.address is None


@contextlib.contextmanager
def pool(workers: Workers) -> Iterator[Run]:
    """A :data:`Run` for ``workers``; what it started (processes, a local Ray) stops when the block ends."""
    backend = workers.backend
    if backend == "in-process":

        def here(
            fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
        ) -> list[Any]:
            return [fn(*shared, *c) for c in calls]

        yield here
        return
    if backend == "processes":
        # spawn: a fork would copy this process's threads (torch, JAX) mid-flight
        ctx = multiprocessing.get_context("spawn")
        with _quiet_forks(), ProcessPoolExecutor(max_workers=workers.count, mp_context=ctx) as ex:

            def in_processes(
                fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
            ) -> list[Any]:
                futures = [ex.submit(fn, *shared, *c) for c in calls]
                return [f.result() for f in futures]

            yield in_processes
        return
    with ray_started(workers.address, workers.count) as ray:

        def run(
            fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
        ) -> list[Any]:
            task = ray.remote(num_cpus=1)(fn)
            refs = [ray.put(x) for x in shared]  # sent once, not once a call
            return list(ray.get([task.remote(*refs, *c) for c in calls]))

        yield run


def import_ray(what: str = "this") -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            f"{what} runs on Ray, which is not installed",
            "install it with: pip install 'quarl-edge[actorq]' (or run without --workers/--address)",
        ) from None
    return ray


def start_ray(address: str | None = None, num_cpus: int | None = None, **options: Any) -> Any:
    """``ray.init`` without its notices on our stderr (its token-authentication note: the local cluster
    keeps token auth, the note only says so; JAX's os.fork warning for Ray's fork+exec of its own
    processes, which exec at once and share no threads). Returns the ``ray`` module."""
    ray = import_ray()
    logging.getLogger(_RAY_TOKEN_LOGGER).addFilter(_drop_token_note)
    with _quiet_forks():
        ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, **options)  # fmt: skip
    return ray


@contextlib.contextmanager
def ray_started(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray, started here (local, or the cluster at ``address``) unless already up; shut down only if
    started here. Yields the ``ray`` module."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        start_ray(address, num_cpus)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


_RAY_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"
_RAY_TOKEN_NOTE = "Token authentication is enabled for this Ray cluster."
# litert-torch imports JAX, whose os.register_at_fork handler warns at every fork of the process
_JAX_FORK = r"os\.fork\(\) was called\. os\.fork\(\) is incompatible with multithreaded code, and JAX"


def _drop_token_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_RAY_TOKEN_NOTE)


@contextlib.contextmanager
def _quiet_forks() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JAX_FORK, category=RuntimeWarning)
        yield
