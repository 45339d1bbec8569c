"""Files shipped with the package: the built-in facts, refusal answers, the TOFU splits (resources/tofu, MIT licence)
and the reports' stylesheet. Nothing here imports another obliviate module."""
from __future__ import annotations

from importlib import resources


def stylesheet() -> str:
    """The CSS of every HTML report (run, demo, audit, sweep comparison), inlined so a page is self-contained."""
    return resources.files(__name__).joinpath("report.css").read_text(encoding="utf-8")
