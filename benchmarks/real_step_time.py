"""Step time of ASU_KL against GradDiff (and a plain fine-tuning step) on the real pretrained model, same batches.

SmolLM2-135M-Instruct (the `smollm2-135m-instruct` alias; converted once into $OBLIVIATE_CACHE), forget =
TOFU world_facts questions with their gold answers, retain = TOFU real_authors, batch 8 + 8, float32 on the
CPU. Each variant runs `--steps` optimizer steps from the same θ0 on the same seeded batch plan; variants are
interleaved in rounds and the median step time over all rounds is compared (the machine is shared: single
steps can spike). Printed: ASU_KL / GradDiff and both against a fine-tuning step on the same forget + retain
rows. Usage: python benchmarks/real_step_time.py [--rounds 2 --steps 4 --lora]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

TOFU = "tofu"  # the copy shipped with obliviate (data.source=tofu)
METHODS = {"GradDiff": {"forget": "ga", "retain": "nll"},
           "ASU_KL": {"forget": "asu", "forget_args": {"tau": 2.0, "layers": None}, "retain": "kl"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lora", action="store_true", help="LoRA r=8 on every linear layer instead of full fine-tuning")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args()

    import torch
    from transformers.utils import logging as hf_logging

    from obliviate.config import MethodConfig, TrainConfig, build
    from obliviate.data.rows import load_split
    from obliviate.modeling.load import load_pretrained
    from obliviate.train.unlearn import finetune, unlearn

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    t = time.perf_counter()
    base, tok = load_pretrained(args.model)
    print(f"model {args.model}: {sum(p.numel() for p in base.parameters()):,} parameters, "
          f"loaded in {time.perf_counter() - t:.1f} s; torch threads {torch.get_num_threads()}")
    forget, retain = load_split(TOFU, "world_facts"), load_split(TOFU, "real_authors")
    train = TrainConfig(max_steps=args.steps, batch_size=8, lr=1e-5, scheduler="constant", weight_decay=0.0,
                        progress=False)

    def student():
        m = copy.deepcopy(base)
        if args.lora:
            from obliviate.modeling.lora import apply_lora

            return apply_lora(m, r=8, alpha=16, dropout=0.0, target_modules=None)
        return m.train()

    times: dict[str, list[float]] = {k: [] for k in (*METHODS, "finetune")}
    for r in range(args.rounds):
        for name, raw in METHODS.items():
            res = unlearn(student(), tok, forget, retain, build(MethodConfig, raw), train, max_length=96)
            times[name] += [h["step_seconds"] for h in res.history[1:]]  # the first step warms up
        # the floor: one plain NLL step on a batch of forget + retain rows (16 rows, as the methods see)
        ft = TrainConfig(max_steps=args.steps, batch_size=16, lr=1e-5, scheduler="constant", weight_decay=0.0,
                         progress=False)
        mixed = [x for pair in zip(forget, retain) for x in pair]
        res = finetune(student(), tok, mixed, ft, max_length=96)
        times["finetune"] += [h["step_seconds"] for h in res.history[1:]]
        print(f"round {r + 1}: " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in times.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    mode = "LoRA r=8" if args.lora else "full fine-tuning"
    print(f"median step ({mode}, batch 8 forget + 8 retain, {len(times['ASU_KL'])} steps each): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()))
    print(f"ratio ASU_KL / GradDiff = {med['ASU_KL'] / med['GradDiff']:.3f}")
    print(f"ratio GradDiff / finetune(16 rows) = {med['GradDiff'] / med['finetune']:.3f}")
    print(f"ratio ASU_KL / finetune(16 rows) = {med['ASU_KL'] / med['finetune']:.3f}")


if __name__ == "__main__":
    main()
