"""The OS settings a real-time control loop asks for, each applied where the OS permits and reported
either way (never silently): CPU affinity, SCHED_FIFO, mlockall, timer slack, a frozen garbage collector.

Device side: the standard library only (os, gc, ctypes for the two Linux calls Python has no wrapper for).
Everything applied is undone when the loop ends (``RealtimeSession.restore``), so a library call never
leaves the caller's process pinned, locked in memory or real-time.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import gc
import os
import resource
import sys
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .schema import JSONObject

FIFO_PRIORITY = 50
"""SCHED_FIFO priority of the loop (1-99): above every normal process and below the kernel's own
real-time threads (IRQ threads run at 50 on PREEMPT_RT kernels, watchdogs at 99)"""
SETTINGS = ("affinity", "timer_slack", "sched_fifo", "mlockall", "gc_freeze")
"""every setting the runner reports, in the order applied (the timer slack before SCHED_FIFO: a real-time
thread's slack reads as 0)"""

_MCL_CURRENT, _MCL_FUTURE, _MCL_ONFAULT = 1, 2, 4
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


@dataclass(frozen=True)
class OsSetting:
    """One OS setting of a loop: whether it was applied, and what was done or why not."""

    name: str
    """one of SETTINGS"""
    applied: bool
    detail: str
    """what was applied (``CPU 1``) or why not (``not permitted: ...; fix``, ``not requested``)"""

    def __post_init__(self) -> None:
        if (
            self.name not in SETTINGS
            or not isinstance(self.applied, bool)
            or not isinstance(self.detail, str)
        ):
            raise ValueError(
                f"OsSetting({self.name!r}, {self.applied!r}, ...) is not a setting of {SETTINGS}"
            )

    def to_dict(self) -> JSONObject:
        return {"name": self.name, "applied": self.applied, "detail": self.detail}

    @classmethod
    def from_dict(cls, d: Any) -> OsSetting:
        if not isinstance(d, dict):
            raise ValueError("an OS setting is not an object")
        return cls(str(d.get("name")), d.get("applied"), str(d.get("detail", ""))[:300])  # type: ignore[arg-type]


@dataclass(frozen=True)
class RealtimeConfig:
    """Which settings to ask for. Every default is on: each is applied where permitted and reported."""

    affinity: tuple[int, ...] | None | str = "auto"
    """CPUs to pin the loop to: ``"auto"`` (the last CPU this process may use: CPU 0 takes most
    interrupts), a tuple of CPU numbers, or None (not requested)"""
    fifo_priority: int | None = FIFO_PRIORITY
    """SCHED_FIFO priority 1-99, or None (not requested)"""
    mlock: bool = True
    """mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT): no page of the loop is paged out"""
    timer_slack: bool = True
    """a 1 ns timer slack (Linux's default 50 us lets every sleep wake up to 50 us late)"""
    freeze_gc: bool = True
    """gc.collect(), gc.freeze(), gc.disable(): no collection pause inside the loop"""

    def __post_init__(self) -> None:
        a = self.affinity
        if not (a is None or a == "auto" or isinstance(a, tuple) and a and all(
                isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 4096 for c in a)):  # fmt: skip
            raise InputError(f"affinity {str(a)[:40]!r} is not 'auto', None or a tuple of CPU numbers",
                             "e.g. affinity=(1,)")  # fmt: skip
        p = self.fifo_priority
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 99):
            raise InputError(f"fifo_priority must be 1-99 or None (got {str(p)[:24]!r})",
                             f"e.g. fifo_priority={FIFO_PRIORITY}")  # fmt: skip

    @classmethod
    def off(cls) -> RealtimeConfig:
        """Nothing requested (a plain loop, every setting reported as not requested)."""
        return cls(affinity=None, fifo_priority=None, mlock=False, timer_slack=False, freeze_gc=False)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


def _why(e: OSError | int, fix: str) -> str:
    code = e if isinstance(e, int) else (e.errno or 0)
    name = errno.errorcode.get(code, str(code))
    if code == errno.EPERM:
        return f"not permitted ({name}); {fix}"
    return f"failed ({name}: {os.strerror(code)}); {fix}"


class RealtimeSession:
    """The settings applied for one loop; ``restore()`` undoes them (safe to call twice)."""

    def __init__(self, cfg: RealtimeConfig) -> None:
        self.cfg = cfg
        self.settings: list[OsSetting] = []
        self._undo: list[Any] = []
        self._libc = _libc()

    def apply(self) -> tuple[OsSetting, ...]:
        for name in SETTINGS:
            try:
                setting = getattr(self, f"_{name}")()
            except Exception as e:  # a setting that breaks must not stop the loop: it is reported
                setting = OsSetting(name, False, f"failed ({type(e).__name__}: {str(e)[:120]})")
            self.settings.append(setting)
        return tuple(self.settings)

    def restore(self) -> None:
        while self._undo:
            undo = self._undo.pop()
            with contextlib.suppress(OSError):  # best effort: the process goes on with what it has
                undo()

    # -- one method per setting, in SETTINGS order ---------------------------------------------------

    def _affinity(self) -> OsSetting:
        want = self.cfg.affinity
        if want is None:
            return OsSetting("affinity", False, "not requested")
        if not hasattr(os, "sched_setaffinity"):
            return OsSetting("affinity", False, f"not available on this OS ({sys.platform})")
        allowed = sorted(os.sched_getaffinity(0))
        cpus: set[int] = {allowed[-1]} if isinstance(want, str) else set(want)
        outside = sorted(cpus - set(allowed))
        if outside:
            return OsSetting("affinity", False, f"CPU {outside[0]} is not one this process may use "
                             f"({_cpus(allowed)}); pick one of those")  # fmt: skip
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            return OsSetting("affinity", False, _why(e, "check the process's cpuset"))
        self._undo.append(lambda: os.sched_setaffinity(0, allowed))
        return OsSetting("affinity", True, f"CPU {_cpus(sorted(cpus))} (of {_cpus(allowed)})")

    def _sched_fifo(self) -> OsSetting:
        prio = self.cfg.fifo_priority
        if prio is None:
            return OsSetting("sched_fifo", False, "not requested")
        if not hasattr(os, "sched_setscheduler"):
            return OsSetting("sched_fifo", False, f"not available on this OS ({sys.platform})")
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
        except OSError as e:
            limit = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
            return OsSetting("sched_fifo", False, _why(e, f"RLIMIT_RTPRIO is {_limit(limit)}: run as root, "
                             f"grant CAP_SYS_NICE, or raise it (ulimit -r {prio}, or rtprio in limits.conf)"))  # fmt: skip
        self._undo.append(lambda: os.sched_setscheduler(0, before[0], before[1]))
        return OsSetting("sched_fifo", True, f"priority {prio}")

    def _mlockall(self) -> OsSetting:
        if not self.cfg.mlock:
            return OsSetting("mlockall", False, "not requested")
        libc = self._libc
        if libc is None or not hasattr(libc, "mlockall"):
            return OsSetting("mlockall", False, f"not available on this OS ({sys.platform})")
        # MCL_ONFAULT (Linux 4.4+) locks pages as they are touched: the loop's pages stay resident without
        # faulting in every mapped library first (hundreds of MiB for a process that loaded a runtime)
        flags = _MCL_CURRENT | _MCL_FUTURE | _MCL_ONFAULT
        if libc.mlockall(flags) != 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL:  # a kernel without MCL_ONFAULT
                flags = _MCL_CURRENT | _MCL_FUTURE
                code = 0 if libc.mlockall(flags) == 0 else ctypes.get_errno()
            if code:
                limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
                fix = (f"RLIMIT_MEMLOCK is {_limit(limit, 'bytes')}: run as root, grant CAP_IPC_LOCK, or "
                       "raise it (ulimit -l unlimited, or memlock in limits.conf)")  # fmt: skip
                return OsSetting("mlockall", False, _why(code, fix))
        self._undo.append(libc.munlockall)
        on_fault = " | MCL_ONFAULT" if flags & _MCL_ONFAULT else ""
        return OsSetting("mlockall", True, f"MCL_CURRENT | MCL_FUTURE{on_fault}")

    def _timer_slack(self) -> OsSetting:
        if not self.cfg.timer_slack:
            return OsSetting("timer_slack", False, "not requested")
        libc = self._libc
        if libc is None or not hasattr(libc, "prctl"):
            return OsSetting("timer_slack", False, f"not available on this OS ({sys.platform})")
        before = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
        if before < 0 or libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0) != 0:
            return OsSetting(
                "timer_slack", False, _why(ctypes.get_errno(), "a kernel with PR_SET_TIMERSLACK")
            )
        self._undo.append(lambda: libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(before), 0, 0, 0))
        return OsSetting("timer_slack", True, f"1 ns (was {before / 1000:g} us)")

    def _gc_freeze(self) -> OsSetting:
        if not self.cfg.freeze_gc:
            return OsSetting("gc_freeze", False, "not requested")
        if not hasattr(gc, "freeze"):
            return OsSetting("gc_freeze", False, f"gc.freeze is not available ({sys.implementation.name})")
        enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        frozen = gc.get_freeze_count()

        def undo() -> None:
            gc.unfreeze()
            if enabled:
                gc.enable()

        self._undo.append(undo)
        return OsSetting("gc_freeze", True, f"{frozen} objects frozen, collection off during the loop")


def _cpus(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def _limit(value: int, unit: str = "") -> str:
    if value == resource.RLIM_INFINITY:
        return "unlimited"
    return f"{value} {unit}".strip()
