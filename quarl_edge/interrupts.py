"""A Ctrl-C stays a Ctrl-C even when a library swallows it.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread happens to be. Inside a converter
(ONNX shape inference, a TFLite/MLIR pass, a fallback ``except Exception``) that exception can be caught,
wrapped or dropped, and the command would go on and write its output as if nothing happened. The handler
installed here also records that SIGINT arrived; commands call :func:`check` before they commit an output
(an atomic rename), so a swallowed Ctrl-C still ends the command with exit 130 and nothing written.
The check is at each command's commit point, not inside runtimes.fsutil's atomic writers: commands also
write on purpose while handling a Ctrl-C (bench keeps its finished episodes for --resume).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_received = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _received.set()
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt, as without this module


def install() -> None:
    """Record SIGINT as well as raising KeyboardInterrupt. Only over Python's own handler and only from the
    main thread: a SIGINT that is ignored (a job started with ``nohup`` or ``&``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def received() -> bool:
    return _received.is_set()


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived since :func:`install`, even one that was swallowed."""
    if _received.is_set():
        raise KeyboardInterrupt
