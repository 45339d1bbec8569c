"""Helpers shared by the training tests: stopping a run mid-way and importing the subprocess workers."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def interrupt_after(steps: int, fn: Callable[[], Any]) -> Any:
    """Run fn, raising KeyboardInterrupt when the loop starts optimizer step `steps + 1` (as Ctrl-C would)."""
    from obliviate.train import loop

    original, count = loop._finish_step, [0]

    def counting(*a, **k):
        count[0] += 1
        if count[0] > steps:
            raise KeyboardInterrupt
        return original(*a, **k)

    loop._finish_step = counting
    try:
        return fn()
    finally:
        loop._finish_step = original


def worker(name: str) -> ModuleType:
    """Import tests/train/<name>.py, the script a torchrun or subprocess test launches, as a module."""
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
