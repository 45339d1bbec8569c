"""Progress of long work: a live rich bar on a terminal, plain flushed log lines elsewhere (a pipe, a file, CI,
nohup), where a live bar would show nothing until the work ends. No torch here.

Two uses: the training loop's steps (`progress`, a line for the first and last step and every ~5% or
LOG_EVERY_S seconds), and phases such as probing, calibration, evaluation or an audit (`phase`, `track`), which
stay silent in a log when they end within QUIET_FOR_S seconds, so that short calls print nothing.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
LOG_EVERY_S = 30.0  # without a terminal: a progress line at least this often (and every ~5% of the work)
QUIET_FOR_S = 10.0  # a phase prints its first log line only after this long (short calls print nothing)


class LogLines:
    """Progress as plain, flushed log lines with the interface of rich's Progress as far as obliviate uses it
    (`add_task`, `update`): one line per ~5% of the work or every LOG_EVERY_S seconds, whichever comes first,
    and always the first and the last, once `quiet_for` seconds have passed since the start."""

    def __init__(self, unit: str = "step ", quiet_for: float = 0.0) -> None:
        self.desc, self.total, self.done, self.start = "train", 1, 0, time.perf_counter()
        self.unit, self.quiet_for = unit, quiet_for
        self.shown_step, self.shown_at = -1, self.start

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: int, terms: str = "", completed: int = 0) -> int:
        self.desc, self.total, self.done = description, max(1, int(total)), int(completed)
        self.start = self.shown_at = time.perf_counter()
        return 0

    def update(self, task: int, advance: int = 1, terms: str = "") -> None:
        now, before = time.perf_counter(), self.done
        self.done += advance
        if now - self.start < self.quiet_for:
            return
        first, last = self.shown_step < 0, self.done >= self.total
        new_bucket = self.done * 20 // self.total > before * 20 // self.total  # crossed a 5% mark
        if first or last or new_bucket or now - self.shown_at >= LOG_EVERY_S:
            pct = 100 * self.done // self.total
            text = f"{self.desc}: {self.unit}{self.done}/{self.total} ({pct}%) {terms}".rstrip()
            print(f"{text} elapsed {clock(now - self.start)}", flush=True)
            self.shown_step, self.shown_at = self.done, now


def clock(seconds: float) -> str:
    """14s, 3m05s, 1h02m."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def on_terminal() -> bool:
    """rich's own test: a TTY (or Jupyter), or FORCE_COLOR / TTY_COMPATIBLE set."""
    from rich import get_console

    console = get_console()
    return console.is_terminal or console.is_jupyter


def progress(enabled: bool, desc: str, steps: int) -> Any:
    """The training loop's progress: a rich bar with the loss terms on a terminal, LogLines elsewhere, nothing
    if disabled."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if enabled and not on_terminal():
        return LogLines()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("{task.fields[terms]}"), disable=not enabled, transient=False)


@contextmanager
def phase(desc: str, total: int, *, quiet_for: float = QUIET_FOR_S) -> Iterator[Callable[[int], None]]:
    """A phase of `total` units of work; yields `advance(n)`. A transient bar on a terminal; in a log, lines as
    LogLines writes them once the phase has run `quiet_for` seconds."""
    if on_terminal():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=16), MofNCompleteColumn(),
                       TimeElapsedColumn(), transient=True)
    else:
        bar = LogLines(unit="", quiet_for=quiet_for)
    with bar:
        task = bar.add_task(desc, total=max(1, total))
        yield lambda n=1: bar.update(task, advance=n)


def track(items: Iterable[T], desc: str, total: int | None = None, *, quiet_for: float = QUIET_FOR_S) -> Iterator[T]:
    """`items`, one at a time, with the progress of `phase` (total: len(items) unless given)."""
    items = items if total is not None or hasattr(items, "__len__") else list(items)
    with phase(desc, total if total is not None else len(items), quiet_for=quiet_for) as advance:  # type: ignore[arg-type]
        for item in items:
            yield item
            advance(1)
