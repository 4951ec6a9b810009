"""Timing shared by the benchmarks (numpy only: the torch-free worker processes import it too)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def per_call_us(fn: Callable[[Any], Any], inputs: list[Any], samples: int) -> float:
    """Median time of one ``fn(x)`` in microseconds, cycling through ``inputs``."""
    clock, out = time.perf_counter_ns, np.empty(samples, np.int64)
    for i in range(samples):
        x = inputs[i % len(inputs)]
        t0 = clock()
        fn(x)
        out[i] = clock() - t0
    return float(np.median(out)) / 1e3
