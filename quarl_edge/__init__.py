"""quarl-edge: fp32 RL policies to quantized int8 models on edge boards, with CI gates.

The role folders ``exporters/``, ``runtimes/``, ``devices/`` and ``calibration_data/`` are installed as
``quarl_edge.exporters``, ``quarl_edge.runtimes``, ``quarl_edge.devices`` and
``quarl_edge.calibration_data`` (pyproject's package-dir mapping; an editable install maps them the same
way). This module must stay import-light: the device side imports ``quarl_edge.runtimes`` and must never
pull in torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
