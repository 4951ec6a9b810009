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
from typing import Any, Protocol

from quarl_edge.runtimes.errors import InputError, MissingDependencyError

MAX_WORKERS = 256


class Job(Protocol):
    def result(self) -> Any:
        """The job's return value (it runs, or is waited for, here)."""
        ...


class Pool(Protocol):
    """Where jobs run. ``submit`` returns at once; a job's result is taken with ``job.result()``."""

    backend: str

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job: ...

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
    ) -> list[Any]:
        """``[fn(*shared, *call) for call in calls]``, side by side where the pool can."""
        ...


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
def pool(workers: Workers) -> Iterator[Pool]:
    """A :class:`Pool` for ``workers``; what it started (processes, a local Ray) stops when the block ends."""
    backend = workers.backend
    if backend == "in-process":
        yield _Here()
    elif backend == "processes":
        # spawn: a fork would copy this process's threads (torch, JAX) mid-flight
        ctx = multiprocessing.get_context("spawn")
        with _quiet_forks(), ProcessPoolExecutor(max_workers=workers.count, mp_context=ctx) as ex:
            yield _Processes(ex)
    else:
        with ray_started(workers.address, workers.count) as ray:
            yield _Ray(ray)


@dataclass
class _Later:
    """An in-process job: it runs when its result is asked for, so a caller's progress lines come as
    each one finishes."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]

    def result(self) -> Any:
        return self.fn(*self.args)


class _Base:
    backend = ""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        raise NotImplementedError

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
    ) -> list[Any]:
        jobs = [self.submit(fn, *shared, *c) for c in calls]
        return [j.result() for j in jobs]


class _Here(_Base):
    backend = "in-process"

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        return _Later(fn, args)


class _Processes(_Base):
    backend = "processes"

    def __init__(self, ex: ProcessPoolExecutor) -> None:
        self.ex = ex

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        return self.ex.submit(fn, *args)


@dataclass
class _RayJob:
    ray: Any
    ref: Any

    def result(self) -> Any:
        return self.ray.get(self.ref)


class _Ray(_Base):
    backend = "ray"

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.tasks: dict[Callable[..., Any], Any] = {}

    def submit(self, fn: Callable[..., Any], *args: Any) -> Job:
        if fn not in self.tasks:
            self.tasks[fn] = self.ray.remote(num_cpus=1)(fn)
        return _RayJob(self.ray, self.tasks[fn].remote(*args))

    def map(
        self, fn: Callable[..., Any], calls: Sequence[tuple[Any, ...]], shared: tuple[Any, ...] = ()
    ) -> list[Any]:
        refs = tuple(self.ray.put(x) for x in shared)  # sent once, not once a call
        return super().map(fn, calls, refs)


def import_ray(what: str = "--address (a Ray cluster)", instead: str = "; or drop --address") -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            f"{what} needs Ray, which is not installed",
            f"install it with: pip install 'quarl-edge[actorq]'{instead}",
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
