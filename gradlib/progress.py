"""Progress of a tuner run: tqdm bars on a terminal; anywhere else (a log file, CI, ``nohup``, a pipe) tqdm draws
nothing, so plain lines go to stderr instead: one per finished shape, and one every :data:`HEARTBEAT_S` seconds
while shapes run without finishing (an interpreted kernel can take minutes per candidate on CPU).

The lines are the CLI's output, like the final table, so they are written whatever the logging level is.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from gradlib.records import ENUMERATE, ItemResult, ShapeOutcome
from gradlib.search import ShapeSearch
from gradlib.tune_ops import shape_label

HEARTBEAT_S = 30.0  # seconds between "still running" lines when not on a terminal


#: How each phase of a search is named on the console.
_PHASES = {ENUMERATE: "listing candidates", "screen": "screening", "full": "timing", "confirm": "confirming"}


def _shape(search: ShapeSearch | ShapeOutcome) -> str:
    return shape_label(search.problem)


def _running(search: ShapeSearch) -> str:
    """Where a running shape is: "timing 3/21 candidates", "confirming 5/12 runs" (the phase's own counts)."""
    phase, done, total = search.progress()
    if phase == ENUMERATE:
        return _PHASES[phase]
    return f"{_PHASES.get(phase, phase)} {done}/{total} " + ("runs" if phase == "confirm" else "candidates")


class Progress:
    """Reports candidates and shapes as the driver hears of them; :meth:`tick` is called every scheduling round."""

    def __init__(self, total: int, describe, stream: TextIO | None = None, tty: bool | None = None,
                 heartbeat_s: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.total, self.done = total, 0
        self.describe = describe  # Solution -> short text
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        self._last_line = time.monotonic()
        self._t0 = self._last_line
        self._current: tuple[int, str] | None = None
        self._shape_bar = self._cand_bar = None
        self._redirect = None
        if self.tty:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
            self._shape_bar = tqdm(total=total, desc="shapes", unit="shape", position=0, file=self.stream)
            self._cand_bar = tqdm(total=0, desc="candidates", unit="cand", position=1, leave=False,
                                  file=self.stream)

    def item(self, search: ShapeSearch, res: ItemResult) -> None:
        """One item of ``search`` finished: the bar shows its phase's count (the search's own, so never above it)."""
        if self._cand_bar is None:
            return
        phase, done, total = search.progress()
        if self._current != (search.shape_id, phase):  # the bar follows the shape last heard of
            self._current = (search.shape_id, phase)
            self._cand_bar.set_description(f"{_shape(search)} {_PHASES.get(phase, phase)}", refresh=False)
        self._cand_bar.total = total
        self._cand_bar.n = done
        self._cand_bar.refresh()

    def shape(self, outcome: ShapeOutcome) -> None:
        """A shape finished (tuned or failed)."""
        self.done += 1
        if self._shape_bar is not None:
            self._shape_bar.update(1)
            return
        w = outcome.winner
        result = (f"{self.describe(w.solution)} {w.us:.3f} us" if w is not None
                  else "FAILED: " + ("; ".join(outcome.errors)[:80] or "no valid candidate"))
        self._line(f"shape {self.done}/{self.total} {_shape(outcome)}: {result} ({outcome.wall_s:.1f} s)")

    def tick(self, active: list[ShapeSearch]) -> None:
        """Every scheduling round: off a terminal, say what is running when nothing was said for a while."""
        if self.tty or not active or time.monotonic() - self._last_line < self.heartbeat_s:
            return
        running = ", ".join(f"{_shape(s)} ({_running(s)})" for s in active[:3]) \
            + (f" and {len(active) - 3} more" if len(active) > 3 else "")
        self._line(f"{self.done}/{self.total} shapes done, {time.monotonic() - self._t0:.0f} s; running {running}")

    def write(self, text: str) -> None:
        """Extra output (``--verbose``'s top candidates) on stdout, without breaking the bars."""
        if self._shape_bar is not None:
            self._shape_bar.write(text)
        else:
            print(text, flush=True)

    def _line(self, text: str, prefix: str = "[gradlib] ") -> None:
        print(prefix + text, file=self.stream, flush=True)
        self._last_line = time.monotonic()

    def close(self) -> None:
        for bar in (self._cand_bar, self._shape_bar):
            if bar is not None:
                bar.close()
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
