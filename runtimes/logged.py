"""The field-logging policy (``load_policy(..., log_dir=...)``): its act() timed and recorded.

A subclass of Policy, imported only when a log is asked for, so that a policy without one runs the plain
``Policy.act`` and never loads this module (runtimes.telemetry writes the log).
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

from numpy.typing import ArrayLike

from .errors import InputError
from .fieldlog import FLAG_CLIPPED, FLAG_FP32, FLAG_NONFINITE, FLAG_OUT_OF_RANGE, header_of
from .policy import Action, Policy
from .telemetry import LOG_EVERY, FieldLogger

_OOR_FLAGS = {"count": 0, "clip": FLAG_CLIPPED, "fp32": FLAG_FP32}


class LoggedPolicy(Policy):
    """A Policy whose every ``log_every``-th act() is timed and recorded in a field log, with its out-of-range
    and NaN flags (runtimes.telemetry). A subclass, so that a policy without a log runs the plain act()."""

    log: FieldLogger
    log_every: int = LOG_EVERY
    calls: int = 0
    """act() calls since load (a record's ``step``)"""

    def act(self, obs: ArrayLike, action_mask: ArrayLike | None = None) -> Action:
        self.calls = n = self.calls + 1
        if n % self.log_every:
            return Policy.act(self, obs, action_mask)
        g = self._guard
        outside, nonfinite = g.out_of_range, g.nonfinite
        t0 = time.perf_counter_ns()
        action = Policy.act(self, obs, action_mask)
        t1 = time.perf_counter_ns()
        flags = 0
        if g.out_of_range != outside:
            flags = FLAG_OUT_OF_RANGE | _OOR_FLAGS[self.on_out_of_range]
        if g.nonfinite != nonfinite:
            flags |= FLAG_NONFINITE
        self.log.record(n, t0, self._stacks[-1].frames if self._stacks else obs, action, t1 - t0, flags)
        return action

    def rehearse(self, obs: ArrayLike, action_mask: ArrayLike | None = None) -> None:
        """``Policy.rehearse``, and the logger's path too: a record made and taken back, so that logging's
        code and the open chunk's next slot are warm as well."""
        g = self._guard
        outside, nonfinite = g.out_of_range, g.nonfinite
        t0 = time.perf_counter_ns()
        Policy.rehearse(self, obs, action_mask)
        t1 = time.perf_counter_ns()
        flags = FLAG_OUT_OF_RANGE if g.out_of_range != outside or g.nonfinite != nonfinite else 0
        self.log.rehearse(self.calls + 1, t0, self._stacks[-1].frames if self._stacks else obs,
                          self._last if self._last is not None else 0, t1 - t0, flags)  # fmt: skip

    def start_log(self, log_dir: str | os.PathLike[str] | Any, every: int, max_bytes: int) -> None:
        """Open the field log (a one-line InputError for a folder that is not ours or of another bundle)."""
        if self._dict is not None or self._io.active:
            what = "Dict observations" if self._dict is not None else "a recurrent state or action masks"
            raise InputError(f"field logs do not record {what} yet (a field report could not replay them)",
                             "load the policy without log_dir")  # fmt: skip
        header = header_of(self.info, self.spec.observation_space.dtype)
        self.log, self.log_every = FieldLogger(log_dir, header, max_bytes), every
        weakref.finalize(self, self.log.close)  # the last chunk at exit, or when the policy goes
