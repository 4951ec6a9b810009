"""An actor's policy model on its runtime: a broadcast payload opened as ``model(obs) -> output``.

One thread, batch 1 ([1, n_obs] float32 in, [1, n_out] float32 out), as an actor runs it. ONNX Runtime
for ``onnx`` payloads, the LiteRT interpreter (XNNPACK, its default CPU delegate) for ``litert`` ones.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import numpy as np

from quarl_edge.actorq.broadcast import RUNTIMES
from quarl_edge.runtimes.errors import InputError, MissingDependencyError
from quarl_edge.runtimes.onnx import precise_int8

Model = Callable[[np.ndarray], np.ndarray]
MODULES = {"onnx": "onnxruntime", "litert": "ai_edge_litert"}
EXTRAS = {"onnx": "quarl-edge[actorq]", "litert": "quarl-edge[tflite]"}


def available_runtimes() -> tuple[str, ...]:
    """The actor runtimes importable in this process."""
    return tuple(r for r in RUNTIMES if importlib.util.find_spec(MODULES[r]) is not None)


def check_runtime(runtime: str) -> None:
    """InputError for an unknown ``--actor-runtime``, MissingDependencyError for one not installed."""
    if runtime == "auto":
        return
    if runtime not in RUNTIMES:
        raise InputError(f"unknown --actor-runtime {runtime[:40]!r}", f"known: auto, {', '.join(RUNTIMES)}")
    if runtime not in available_runtimes():
        raise MissingDependencyError(f"--actor-runtime {runtime} needs {MODULES[runtime]}",
                                     f"pip install '{EXTRAS[runtime]}'")  # fmt: skip


def open_model(runtime: str, model: bytes) -> Model:
    """``model`` (bytes of a payload for ``runtime``) as a one-thread, batch-1 callable."""
    if runtime == "litert":
        from ai_edge_litert.interpreter import Interpreter

        interp = Interpreter(model_content=model, num_threads=1)
        interp.allocate_tensors()
        i, o = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]

        def run_litert(obs: np.ndarray) -> np.ndarray:
            interp.set_tensor(i, obs)
            interp.invoke()
            return interp.get_tensor(o)

        return run_litert
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    precise_int8(so)
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run_onnx(obs: np.ndarray) -> np.ndarray:
        return session.run(None, {name: obs})[0]

    return run_onnx
