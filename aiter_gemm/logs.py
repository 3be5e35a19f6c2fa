"""Logging helpers shared by the runtime: warn once per cause, and the handler ``AITER_LOG_TUNED_CONFIG`` adds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

log = logging.getLogger("aiter_gemm")


class WarnOnce:
    """Log a warning (or ``level``) the first time a key is seen (per instance; :meth:`clear` forgets). A row that
    cannot run is looked at once per shape, and a model has hundreds of shapes: one line per cause, not per shape."""

    def __init__(self, logger: logging.Logger = log, level: int = logging.WARNING) -> None:
        self._logger = logger
        self._level = level
        self._seen: set[Hashable] = set()
        self._lock = threading.Lock()

    def __call__(self, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged; True if this call logged."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(self._level, msg, *args)
        return True

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


class PrefixFormatter(logging.Formatter):
    """``[aiter_gemm] <message>``, as AITER prints ``[aiter] ...``. Messages that name the package themselves
    (``aiter_gemm: ...``, so they read right where a bare handler prints the message alone, as Python's last-resort
    handler does for warnings) lose that prefix here, instead of printing ``[aiter_gemm] aiter_gemm: ...``."""

    PREFIX = "aiter_gemm: "

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return "[aiter_gemm] " + (text[len(self.PREFIX):] if text.startswith(self.PREFIX) else text)


def ensure_info_handler() -> None:
    """Make INFO lines of ``aiter_gemm`` visible when the application configured no logging at all (the
    ``AITER_LOG_TUNED_CONFIG=1`` promise: the lines show up without the user setting logging up)."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(PrefixFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
