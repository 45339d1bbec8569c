"""What ASU's forget-teacher itself says on the forget facts, per (τ, layers): greedy forget accuracy and the
share of degenerate (empty / looping) replies. Distillation moves the student towards this teacher, so these are
the reachable ends of ASU's trade-off on a model. Reads the groups the real demo wrote.

Usage (after `obliviate demo --config configs/demo_real.yaml`):
  python benchmarks/teacher_tradeoff.py [--groups obliviate-demo-real/facts] [--model smollm2-135m-instruct]
"""
from __future__ import annotations

import argparse
import time

GRID = [(2.0, None), (1.5, None), (2.0, [0, 1, 2, 3, 4, 5, 6]), (3.0, [0, 1, 2, 3, 4, 5, 6]), (3.0, [0, 1]),
        (4.0, [0, 1]), (6.0, [0, 1]), (8.0, [0, 1]), (4.0, [6, 7, 8]), (16.0, [6, 7, 8])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="obliviate-demo-real/facts")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()

    from transformers.utils import logging as hf_logging

    from obliviate.data.rows import load_split
    from obliviate.eval.fluency import fluency_summary
    from obliviate.eval.generate import generate_answers
    from obliviate.eval.knowledge import Fact, is_correct
    from obliviate.modeling.load import load_pretrained
    from obliviate.modeling.smoothing import smoothed_teacher

    hf_logging.set_verbosity_error()
    model, tok = load_pretrained(args.model)
    rows = load_split(args.groups, "forget")
    facts = [Fact(str(i), "forget", "", r.question, r.answer[r.fact_spans[0][0]:r.fact_spans[0][1]]) for i, r in enumerate(rows)]
    print(f"{len(rows)} forget facts of {args.groups}; θ0 answers all of them correctly by construction")
    print("| tau | layers | teacher forget accuracy | degenerate share | example reply |\n|---|---|---|---|---|")
    for tau, layers in GRID:
        t = time.perf_counter()
        teacher = smoothed_teacher(model, tau, layers)
        replies = generate_answers(teacher, tok, [r.question for r in rows], max_new_tokens=args.max_new_tokens)
        acc = sum(is_correct(x, f) for x, f in zip(replies, facts)) / len(facts)
        deg = fluency_summary(replies, tok)["degenerate_share"]
        where = "all" if layers is None else ",".join(map(str, layers))
        print(f"| {tau:g} | {where} | {acc:.2f} | {deg:.2f} | {replies[1]!r} |  ({time.perf_counter() - t:.0f} s)")
        del teacher


if __name__ == "__main__":
    main()
