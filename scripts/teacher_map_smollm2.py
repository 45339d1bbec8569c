"""The teacher map of SmolLM2-135M-Instruct on the facts it knows (docs/results.md §15).

Probes θ0 as `obliviate demo --config configs/demo_real.yaml` does (the built-in facts and TOFU's world facts and real
authors), writes the known facts' training rows by group into OUT/facts/, then runs
`obliviate calibrate` there with the teacher map on: τ × contiguous layer windows across the depth, each point's
greedy replies on the forget facts (capitals) and on the retain facts.

Run from the repository root (about 15 minutes on 2 CPU cores):
    python scripts/teacher_map_smollm2.py runs/teacher-map-smollm2
"""
from __future__ import annotations

import sys
from pathlib import Path

TAUS = [1.5, 2.3, 4.0, 6.0, 8.0]
WIDTHS = [1, 3, 10]
STARTS = 4  # windows start at layers spread from 0 to 30 - width: 12 windows


def main(out: Path) -> int:
    from obliviate.cli import main as cli
    from obliviate.config import load_config
    from obliviate.setups.knowledge import KnowledgeDemoConfig, probe_and_split, probe_facts, write_groups
    from obliviate.train.student import load_model

    cfg = load_config(KnowledgeDemoConfig, Path("configs/demo_real.yaml"))
    model, tok = load_model(cfg.model)
    _, split = probe_and_split(model, tok, probe_facts(cfg.knowledge), cfg)
    write_groups(out / "facts", split)
    del model
    return cli(["calibrate", f"model.path={cfg.model.path}", f"source={out / 'facts'}", "split=forget",
                "retain_split=retain", "retain_examples=32", "max_examples=null", f"taus={TAUS}",
                f"window_widths={WIDTHS}", f"window_starts={STARTS}", "replies=true", "max_new_tokens=24",
                f"max_length={cfg.max_length}", f"output_dir={out / 'map'}"])


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/teacher-map-smollm2")))
