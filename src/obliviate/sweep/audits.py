"""Each method's best under attack, in `obliviate compare --audits DIR`: the audit of the best trained again alone
(`obliviate compare --best-configs best/`, then `obliviate unlearn --config best/<method>.yaml audit.enabled=true
output_dir=DIR/<method>`), read from DIR/<method>/audit/audit.json: the recovered share of each attack's headline
(audit/run.py: 0% = the reference the audit names, 100% = back to θ0). scripts/audit_bests.sh keeps the config it
trained beside each audit (DIR/<method>/best.yaml), so an audit of an earlier best is named as such, not shown as
the current best's, and a method whose audit is of its current best is not audited again."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from obliviate.audit.verdict import share_with_interval
from obliviate.errors import ObliviateError

ATTACKS = ("relearn", "quantize", "paraphrase", "mia")
AUDITED = "best.yaml"  # beside an audit: the best's config it trained, with best_header's first line
_HEADER = re.compile(r"^# (.+?) of the sweep in ")


def slug(name: str) -> str:
    """A method name as a file name part: NPO+SAGO -> NPO+SAGO, 'my method' -> my_method."""
    return re.sub(r"[^A-Za-z0-9+._-]+", "_", name)


def audit_file(audits: Path, method: str) -> Path:
    return audits / slug(method) / "audit" / "audit.json"


def best_header(trial: str, sweep_dir: Path, bar: str) -> str:
    """The first line of a best's config file (sweep/export.py): which trial of which sweep, under which bar."""
    return f"# {trial} of the sweep in {sweep_dir}: its best under the bar ({bar}).\n"


def audited_trial(audits: Path, method: str) -> str | None:
    """The trial whose config the audit under audits/<method> trained (its best.yaml's header); None when no
    best.yaml is there (an audit run by hand) or its first line is not best_header's."""
    path = audits / slug(method) / AUDITED
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as f:
        found = _HEADER.match(f.readline())
    return found.group(1) if found else None


def audit_section(bests: Sequence[Any], audits: Path) -> tuple[list[str], dict[str, Any]]:
    """(Markdown lines, {method: {trial, file, ref0, shares}}) for the bests (compare's Best: .method, .point) whose
    audit exists under `audits`; an ObliviateError naming the expected files when none does."""
    named = [b for b in bests if b.point is not None]
    lines = ["## Each best under attack", "", f"The audit of each best trained again alone ({audits}/<method>): the "
             "share of the forgotten knowledge each attack's strongest variant brings back (0% = the audit's "
             "reference, 100% = θ0; clipped to [0%, 100%], * when clipped), with its 95% interval over the forget "
             "rows (none for mia, an AUC). One run each: the rows are all the interval resamples.", "",
             "| method | best | " + " | ".join(ATTACKS) + " | 0% reference |", "|---|---|" + "---|" * len(ATTACKS) + "---|"]
    summary: dict[str, Any] = {}
    stale, missing = [], []
    for b in named:
        path = audit_file(audits, b.method)
        if not path.is_file():
            missing.append(f"{b.method} ({b.point.name})")
            continue
        trial = audited_trial(audits, b.method)
        if trial is not None and trial != b.point.name:  # the best changed since: not this best's audit
            stale.append(f"{b.method} (audited {trial}, best now {b.point.name})")
            continue
        try:
            audit = json.loads(path.read_text(encoding="utf-8"))
            verdict = audit["verdict"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ObliviateError(f"--audits: {path} is not an audit.json that obliviate audit wrote ({exc!r}); run "
                                 "the audit again") from None
        shares = {k: (verdict.get(k) or {}).get("share") for k in ATTACKS}
        intervals = {k: (verdict.get(k) or {}).get("interval") for k in ATTACKS}  # None in audits made before them
        summary[b.method] = {"trial": b.point.name, "file": str(path), "ref0": audit.get("ref0"), "shares": shares,
                             "intervals": intervals, "variants": {k: (verdict.get(k) or {}).get("variant")
                                                                  for k in ATTACKS}}
        lines.append(f"| {b.method} | {b.point.name} | "
                     + " | ".join(share_with_interval(shares[k], intervals[k]) for k in ATTACKS)
                     + f" | {audit.get('ref0') or '?'} |")
    again = (f"; audits of an earlier best, not shown: {', '.join(stale)}: run scripts/audit_bests.sh again"
             if stale else "")
    if not summary:
        expected = ", ".join(str(audit_file(audits, b.method)) for b in named) or "none: no method has a best"
        raise ObliviateError(f"--audits: no audit of a best under {audits} (expected {expected}){again}; run "
                             "`obliviate compare SWEEP --best-configs best/`, then `obliviate unlearn --config "
                             f"best/<method>.yaml audit.enabled=true output_dir={audits}/<method>`")
    note = [f"Audits of an earlier best, not shown: {', '.join(stale)}; run scripts/audit_bests.sh again to audit "
            "the current best.", ""] if stale else []
    if missing:
        note += [f"Bests with no audit under {audits}: {', '.join(missing)}.", ""]
    return lines + [""] + note, summary
