"""ActorQ energy accounting: CPU seconds per role, and joules measured (RAPL) or estimated from them.

Every role measures its own process: `LapTimer` (actors.py) reads ``time.process_time()`` (user + system
CPU of all the process's threads) in the learner and in each Ray actor, and each actor sends its figure
with every batch. Ray's own processes (raylet, GCS) are not counted.

Joules: where the machine exposes RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``, also the name
AMD's driver uses) and it is readable, the package counters are sampled at every batch the learner
receives (so a wrap-around of a counter between two samples is recovered from ``max_energy_range_uj``).
RAPL measures the whole package: other jobs on the machine count too. Otherwise the figure is an
estimate: CPU seconds x WATTS_PER_BUSY_CORE, an assumption stated in the output. The estimate is
proportional to CPU time, so a ratio of two estimates (fp32 over int8) does not depend on the figure.
"""

from __future__ import annotations

from pathlib import Path

from quarl_edge.actorq.result import Energy

RAPL_ROOT = Path("/sys/class/powercap")
WATTS_PER_BUSY_CORE = 5.0
ASSUMPTION = (
    f"estimate, not a measurement: CPU seconds x {WATTS_PER_BUSY_CORE:g} W per busy core, an assumed round "
    "figure for one loaded laptop-class x86 core (a Raspberry Pi 4 core draws less, a desktop core more); "
    "no RAPL counters readable here. Ratios of two estimates do not depend on it."
)


def read_rapl(root: Path = RAPL_ROOT) -> dict[str, tuple[int, int]] | None:
    """{package zone: (energy_uj, max_energy_range_uj)} of the top-level RAPL zones, or None when there
    are none or one is unreadable (a VM, or counters readable by root only)."""
    zones: dict[str, tuple[int, int]] = {}
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:  # intel-rapl:0:0 (core, uncore, dram) is part of package 0
            continue
        try:
            energy = int((zone / "energy_uj").read_text())
            span = int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            return None
        zones[zone.name] = (energy, span)
    return zones or None


def rapl_delta_j(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> float:
    """Joules between two readings, summed over zones; a counter that wrapped once is corrected."""
    total = 0
    for zone, (e0, span) in before.items():
        d = after[zone][0] - e0
        if d < 0:  # the counter passed max_energy_range_uj and restarted from 0
            d += span
        total += d
    return total / 1e6


class EnergyMeter:
    """Joules so far for the run: RAPL sampled on every `joules` call, else cpu_s x the assumed watts."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self.root = root
        self.last = read_rapl(root)
        self.source = "rapl" if self.last is not None else "estimate"
        self.measured_j = 0.0

    def joules(self, cpu_s: float) -> float:
        if self.last is None:
            return cpu_s * WATTS_PER_BUSY_CORE
        now = read_rapl(self.root)
        if now is not None and now.keys() == self.last.keys():
            self.measured_j += rapl_delta_j(self.last, now)
            self.last = now
        return self.measured_j

    def report(self, cpu_s: dict[str, float], wall_s: float) -> Energy:
        """The log's ``energy`` entry: source, joules, wall time, CPU seconds per role."""
        total = sum(cpu_s.values())
        return Energy(
            source=self.source,
            joules=self.joules(total),
            wall_s=wall_s,
            cpu_s=cpu_s,
            cpu_s_total=total,
            assumption=None if self.source == "rapl" else ASSUMPTION,
            scope="RAPL package counters (the whole machine)" if self.source == "rapl"
            else "learner and actor processes; Ray's own processes not counted",
        )  # fmt: skip
