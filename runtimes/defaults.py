"""How a measurement runs unless asked otherwise, defined once for the device's runner (``python -m
quarl_edge.runtimes run``, runner.run_model) and the host's bench (quarl_edge.bench.config.BenchConfig,
whose CLI help reads them). Plain numbers, no import: reading them costs nothing."""

THREADS = 1
"""inference threads per model"""
LATENCY_SAMPLES = 1000
"""single-observation inferences timed per model"""
WARMUP = 50
"""untimed inferences before the latency samples"""
