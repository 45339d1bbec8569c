"""Unlearning step time under train.precision=bf16 (autocast of the forward passes) against float32, same batches.

A real model (default: the `smollm2-135m-instruct` alias; any folder with --model, e.g. the TOFU-20 target),
forget = TOFU world_facts questions with their gold answers, retain = TOFU real_authors, batch 8 + 8 at
max_length 192. ASU_KL (its teacher forward included) and GradDiff each run `--steps` optimizer steps from the
same θ0 under both precisions; variants are interleaved in rounds and the median step time over all rounds is
compared (a shared machine spikes). Printed: per method, fp32 and bf16 medians and the ratio fp32 / bf16 (above 1:
bf16 is faster), and the loss after the last step under each (the two runs' losses differ by bf16 rounding only).
bf16 pays off where the CPU has bf16 matrix instructions (AVX512-BF16, AMX); elsewhere the ratio can fall below 1.
Usage: python benchmarks/precision.py [--model runs/tofu20-smollm2-target --rounds 2 --steps 3]
"""
from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

TOFU = "tofu"  # the copy shipped with obliviate (data.source=tofu)
METHODS = {"GradDiff": {"forget": "ga", "retain": "nll"},
           "ASU_KL": {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": "kl"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from obliviate.config import MethodConfig, TrainConfig, build
    from obliviate.data.rows import load_split
    from obliviate.modeling.load import load_pretrained
    from obliviate.train.unlearn import unlearn

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    base, tok = load_pretrained(args.model)
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.is_file() else ""  # Linux; elsewhere the line says False
    print(f"model {args.model}; torch threads {torch.get_num_threads()}; CPU bf16 instructions: "
          f"{'avx512_bf16' in flags or 'amx_bf16' in flags}")
    forget, retain = load_split(TOFU, "world_facts"), load_split(TOFU, "real_authors")
    times: dict[tuple[str, str], list[float]] = {(m, p): [] for m in METHODS for p in ("fp32", "bf16")}
    last: dict[tuple[str, str], float] = {}
    for r in range(args.rounds):
        for name, raw in METHODS.items():
            for precision in ("fp32", "bf16"):
                train = TrainConfig(max_steps=args.steps, batch_size=8, lr=1e-5, scheduler="constant",
                                    weight_decay=0.0, progress=False, precision=precision)
                res = unlearn(copy.deepcopy(base).train(), tok, forget, retain, build(MethodConfig, raw), train,
                              max_length=192)
                times[(name, precision)] += [h["step_seconds"] for h in res.history[1:]]  # the first warms up
                last[(name, precision)] = float(res.history[-1]["loss"])
        print(f"round {r + 1}: " + ", ".join(f"{m} {p} {statistics.median(v):.2f} s" for (m, p), v in times.items()))
    for name in METHODS:
        fp, bf = statistics.median(times[(name, "fp32")]), statistics.median(times[(name, "bf16")])
        print(f"{name}: median step fp32 {fp:.2f} s, bf16 {bf:.2f} s; ratio fp32 / bf16 = {fp / bf:.2f}; "
              f"last loss fp32 {last[(name, 'fp32')]:.4f}, bf16 {last[(name, 'bf16')]:.4f}")


if __name__ == "__main__":
    main()
