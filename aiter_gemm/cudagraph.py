"""Whether this thread is capturing a CUDA graph, for the price of an attribute read.

Decisions whose graph-timed choice is a launch-heavy backend (Triton) run the eager default outside capture, so they
ask "capturing?" on every call. ``torch.cuda.is_current_stream_capturing()`` asks the driver: on the H100 host of
the defaults sweep (benchmarks/results/defaults) such decisions cost 2.2-4.5 us more per eager call than
plain torch decisions did (F.linear there: 15-26 us per call). Every capture made through torch's Python API
(``torch.cuda.graph``, ``make_graphed_callables``, Inductor's CUDA-graph trees) goes through
``CUDAGraph.capture_begin`` / ``capture_end``, so counting those calls per thread answers the question instead.

A capture started any other way (a raw ``cudaStreamBeginCapture``) is not seen; the caller then runs its eager
choice, which is always a graph-capturable backend (torch, cuBLASLt): a miss costs a slower kernel in that graph,
never a failed capture or a wrong result.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

class CaptureState(threading.local):
    """Per thread: ``depth``, how many captures this thread is inside (public: the C++ eager entry reads it)."""

    depth = 0  # a class attribute: every thread reads 0 until it captures


capture_state = CaptureState()
_lock = threading.Lock()
_MARK = "_aiter_gemm_counts_captures"


def capturing() -> bool:
    """True while this thread is between ``CUDAGraph.capture_begin`` and ``capture_end`` (see :func:`probe`)."""
    return capture_state.depth > 0


def count_captures(cls: type) -> bool:
    """Wrap ``cls.capture_begin`` / ``capture_end`` (once) so :func:`capturing` follows them; False if ``cls`` has
    no such methods. A failed ``capture_begin`` counts nothing; ``capture_end`` uncounts even when it raises (the
    capture is over either way)."""
    with _lock:
        begin, end = getattr(cls, "capture_begin", None), getattr(cls, "capture_end", None)
        if not callable(begin) or not callable(end):
            return False
        if getattr(begin, _MARK, False):
            return True

        @functools.wraps(begin)
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = begin(self, *args, **kwargs)
            capture_state.depth += 1
            return out

        @functools.wraps(end)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return end(self, *args, **kwargs)
            finally:
                depth = capture_state.depth
                if depth:
                    capture_state.depth = depth - 1

        setattr(capture_begin, _MARK, True)
        setattr(capture_end, _MARK, True)
        cls.capture_begin, cls.capture_end = capture_begin, capture_end
        return True


def probe() -> Callable[[], bool]:
    """The cheapest reliable "is this thread capturing?": :func:`capturing` once torch's ``CUDAGraph`` is counted,
    else torch's driver query."""
    cls = getattr(torch.cuda, "CUDAGraph", None)
    if cls is not None and count_captures(cls):
        return capturing
    log.info("torch.cuda.CUDAGraph has no capture_begin/capture_end to count: asking the driver on each call")
    return torch.cuda.is_current_stream_capturing
