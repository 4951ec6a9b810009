"""quarl-edge: fp32 RL policies to quantized int8 models on edge boards, with CI gates.

The role folders ``exporters/``, ``runtimes/``, ``devices/`` and ``calibration_data/`` are installed as
``quarl_edge.exporters``, ``quarl_edge.runtimes``, ``quarl_edge.devices`` and
``quarl_edge.calibration_data`` (pyproject's package-dir mapping; an editable install maps them the same
way). This module must stay import-light: the device side imports ``quarl_edge.runtimes`` and must never
pull in torch.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

# ONNX Runtime 1.32 writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/{deviceid,onnxruntime.db} when it
# is imported, and queues usage events for Microsoft's collector, unless this is set before it loads
# (disable_telemetry_events() after the import is too late for the files). Every import of ours runs this
# first (the device runner's zipapp and the runtime wheel carry this file), so nothing of ours writes
# outside our folders on a board. A user who sets it to 0 keeps ONNX Runtime's default.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
