"""The runtime-only distribution: ``quarl-edge-runtime``, a pure-Python wheel of ``quarl_edge/__init__.py``
and ``quarl_edge/runtimes/`` (the files the device runner zipapp carries), built from this installation
in memory, byte-for-byte reproducible. On a board it gives ``from quarl_edge.runtimes import load_policy``
with numpy and one runtime and never torch; pip installs it offline (``--no-index``). Its extras name the
runtimes: ``[onnx]`` onnxruntime, ``[litert]`` ai-edge-litert, ``[env]`` gymnasium (closed loops)."""

from __future__ import annotations

import base64
import hashlib
import zipfile

from quarl_edge import __version__
from quarl_edge.devices.zipapp import Archive, _sources, write_zip
from quarl_edge.runtimes.fsutil import sha256_bytes

NAME = "quarl_edge_runtime"
METADATA = f"""Metadata-Version: 2.1
Name: quarl-edge-runtime
Version: {__version__}
Summary: quarl-edge's device side: load a bundle, act in a control loop (numpy + one runtime, no torch)
Requires-Python: >=3.9
Requires-Dist: numpy
Provides-Extra: onnx
Requires-Dist: onnxruntime; extra == "onnx"
Provides-Extra: litert
Requires-Dist: ai-edge-litert; extra == "litert"
Provides-Extra: env
Requires-Dist: gymnasium; extra == "env"
"""
WHEEL = "Wheel-Version: 1.0\nGenerator: quarl-edge\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_runtime_wheel() -> Archive:
    info = f"{NAME}-{__version__}.dist-info"
    entries = [(arc, src.read_bytes()) for arc, src in _sources()]
    entries += [(f"{info}/METADATA", METADATA.encode()), (f"{info}/WHEEL", WHEEL.encode())]
    record = (
        "".join(f"{arc},{_record_hash(data)},{len(data)}\n" for arc, data in entries) + f"{info}/RECORD,,\n"
    )
    entries.append((f"{info}/RECORD", record.encode()))
    data = write_zip(entries, zipfile.ZIP_DEFLATED)  # RECORD last, as wheel writers do
    name = f"{NAME}-{__version__}-py3-none-any.whl"
    return Archive(data, sha256_bytes(data), tuple(arc for arc, _ in entries), name)
