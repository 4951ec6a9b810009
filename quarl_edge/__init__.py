"""quarl-edge: fp32 RL policies to quantized int8 models on edge boards, with CI gates.

The role folders ``exporters/``, ``runtimes/`` and ``devices/`` are installed as
``quarl_edge.exporters``, ``quarl_edge.runtimes`` and ``quarl_edge.devices`` (pyproject's
package-dir mapping). This module must stay import-light: the device side imports
``quarl_edge.runtimes`` and must never pull in torch.
"""

from __future__ import annotations

from pathlib import Path as _Path

__version__ = "0.1.0"

# Running from a source checkout (e.g. `python -m ...` with the repo root as cwd) finds this
# folder before the installed mapping; let the sibling role folders resolve as subpackages.
_root = _Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "runtimes" / "__init__.py").is_file():
    __path__.append(str(_root))  # noqa: F821  (module __path__ exists for packages)
