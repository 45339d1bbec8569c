"""Batched evaluation vs a one-example-at-a-time loop, same model and data, measured in one run.

Times `evaluate_split` (greedy generation with KV cache + all answer/paraphrase/perturbed
log-likelihoods, the answers to one question scored after one shared prompt) on TOFU forget01_perturbed with
the default eval.batch_size and with batch_size=1 (no sharing: one example at a time), and prints the time ratio
(issue 11 target: batched <= 0.25x one at a time, at TOFU's 200 new tokens). The model is a freshly initialised Llama (hidden 256 x 4 layers) with a
BPE tokenizer trained on TOFU; both runs generate the same number of tokens (max_new_tokens, no
early EOS from an untrained model), so the comparison is like for like.
Usage: python benchmarks/eval_speed.py [--rows 40] [--max-new-tokens 64] [--repeats 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

TOFU = "tofu"  # the copy shipped with obliviate (data.source=tofu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=200, help="TOFU generates 200")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None, help="default: EvalConfig's eval.batch_size")
    args = ap.parse_args()
    import torch

    from obliviate.data.rows import load_split
    from obliviate.eval.tofu import evaluate_split
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    torch.set_num_threads(1)
    if args.batch_size is None:
        from obliviate.config import EvalConfig

        args.batch_size = EvalConfig().batch_size
    rows = load_split(TOFU, "forget01_perturbed")[: args.rows]
    tok = train_tokenizer([t for r in load_split(TOFU, "full") for t in (r.question, r.answer)], vocab_size=2048)
    model = tiny_llama(tok, hidden_size=256, num_layers=4, num_heads=8, seed=0).eval()
    times: dict[int, list[float]] = {args.batch_size: [], 1: []}
    results = {}
    for _ in range(args.repeats):
        for bs in (args.batch_size, 1):  # interleaved so machine noise hits both
            t = time.perf_counter()
            results[bs] = evaluate_split(model, tok, rows, kind="forget", max_new_tokens=args.max_new_tokens,
                                         batch_size=bs, max_length=256)
            times[bs].append(time.perf_counter() - t)
    same = results[1].generations == results[args.batch_size].generations
    diff = float(abs(results[1].avg_loss - results[args.batch_size].avg_loss).max())
    med = {k: statistics.median(v) for k, v in times.items()}
    n_seq = len(rows) * (2 + len(rows[0].perturbed_answer))
    print(f"{len(rows)} questions, {n_seq} scored answers, {args.max_new_tokens} new tokens each; 1 thread")
    print(f"  batched (batch {args.batch_size}): {med[args.batch_size]:.2f} s   one at a time: {med[1]:.2f} s")
    print(f"time ratio batched / one-at-a-time = {med[args.batch_size] / med[1]:.3f}   (target <= 0.25; "
          f"speed-up {med[1] / med[args.batch_size]:.2f}x)")
    print(f"same generations: {same}; max |avg_loss difference| = {diff:.2e}")


if __name__ == "__main__":
    main()
