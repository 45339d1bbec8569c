"""A TOFU transfer study's forget ROUGE-L on the held-out forget rows its source study's selection never read
(docs/results.md §24: forget05 is the second of forget10's authors, so some of its held-out rows were among the rows
the forget10 selection read).

For each method: the mean over its seeds of forget ROUGE-L recall on those rows, with the 95% percentile-bootstrap
interval over seeds × rows (eval/intervals.py), beside the same on all its held-out forget rows (what `obliviate
compare` reports). Reads both studies' sweep.yaml and storage and the prepared TOFU files; writes nothing.

Run from the repository root:
    python scripts/transfer_unseen.py docs/sweeps/smollm2_tofu20_forget05_cpu docs/sweeps/smollm2_tofu20_cpu
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import yaml

METRIC = "forget_rougeL_recall"


def _questions(sweep_dir: Path) -> tuple[list[str], float, int]:
    """The study's forget evaluation questions (its eval.forget_split, in file order), held-out share and cut seed."""
    from obliviate.config import build
    from obliviate.sweep.config import SweepConfig
    from obliviate.sweep.run import plan_sweep

    recorded = yaml.safe_load((sweep_dir / "sweep.yaml").read_text(encoding="utf-8"))
    cfg = build(SweepConfig, recorded)
    run = plan_sweep(cfg).track.cfg
    lines = (Path(run.data.source) / f"{run.eval.forget_split}.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line)["question"] for line in lines if line.strip()]
    return rows[: run.eval.max_examples] if run.eval.max_examples else rows, cfg.heldout_share, cfg.seed


def _seeds(db: Path) -> dict[str, list[tuple[dict, list[float]]]]:
    """method -> one (report metrics, held-out forget rows) per finished trial, repeats included."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        found = con.execute(
            "SELECT s.study_name, a.value_json FROM trial_user_attributes a JOIN trials t USING (trial_id) "
            "JOIN studies s USING (study_id) WHERE a.key = 'report' AND t.state = 'COMPLETE' ORDER BY t.number").fetchall()
    finally:
        con.close()
    out: dict[str, list[tuple[dict, list[float]]]] = {}
    for name, value in found:
        report = json.loads(value)
        out.setdefault(name.split("/", 1)[-1], []).append((report["metrics"], report["rows"][METRIC]))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    from obliviate.eval.heldout import unseen_positions
    from obliviate.eval.intervals import bootstrap

    transfer, source = (Path(a) for a in argv)
    for d in (transfer, source):
        if not (d / "sweep.yaml").is_file() or not (d / "sweep.db").is_file():
            print(f"{d} is not a sweep snapshot (no sweep.yaml and sweep.db): pass the folders `obliviate compare` "
                  "reads, e.g. docs/sweeps/smollm2_tofu20_forget05_cpu docs/sweeps/smollm2_tofu20_cpu", file=sys.stderr)
            return 2
    rows, share, seed = _questions(transfer)
    src_rows, src_share, src_seed = _questions(source)
    keep = unseen_positions(rows, src_rows, share, seed, src_share, src_seed)
    print(f"{transfer}: {len(keep)} of its held-out forget rows were never read by the selection of {source}")
    print("| method | seeds | forget ROUGE-L, all held-out rows | the same, rows the selection never read |")
    print("|---|---|---|---|")
    score = lambda m: m[METRIC]  # noqa: E731
    for method, seeds in _seeds(transfer / "sweep.db").items():
        every = bootstrap(score, [(m, {METRIC: r}) for m, r in seeds])
        unseen = bootstrap(score, [(m, {METRIC: [r[p] for p in keep]}) for m, r in seeds])
        cells = [f"{i.estimate:.3f} [{i.low:.3f}, {i.high:.3f}]" for i in (every, unseen)]
        print(f"| {method} | {len(seeds)} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
