"""GradDiff's step against the floor, a plain fine-tuning step on the same forget + retain batches, in one run.

The floor is what anyone writes by hand: Hugging Face's causal-LM loss (`model(..., labels=...).loss`, logits
over every position) on the forget batch plus the same on the retain batch, one backward, torch AdamW. Printed:
  graddiff / floor            obliviate's GradDiff (GA + NLL, accelerate loop, divergence guard)   -> target <= 1.05,
                              and below 1 once logits are computed only where labels are
  graddiff / floor_labels     the same hand loop with obliviate's log-probs (logits only at label positions):
                              what the loop itself costs over the same arithmetic
  floor_labels / floor        what computing logits only at label positions saves
Setup as sago_overhead.py (Llama hidden x layers, BPE vocab 2048, TOFU forget10/retain90 in the chat-less
`Question: … Answer:` format, batch 8 + 8, 1 thread), every variant on the same seeded batch plan; variants
interleaved in rounds, median step time (the first step of each run dropped). Usage:
python benchmarks/step_floor.py [--rounds 4 --steps 9 --hidden 256 --layers 4 --vocab 2048]
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sago_overhead import interleaved, setup, timing_args


def hand_loop(model, tok, forget, retain, steps: int, labels_only: bool) -> list[float]:
    """Step times of a plain fine-tuning loop (forget NLL + retain NLL, one backward, AdamW) on obliviate's batch plan."""
    import torch

    from obliviate.data.pairing import paired_batches
    from obliviate.data.tokenize import collate, pad_id
    from obliviate.modeling.logprobs import forward_stats
    from obliviate.train.unlearn import encode_rows

    fe, re_ = encode_rows(tok, forget, 256), encode_rows(tok, retain, 256)
    pad = pad_id(tok)
    plan = paired_batches(len(fe), len(re_), 8, seed=0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0)
    model.train()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fi, ri = next(plan)
        loss = 0.0
        for enc, idx in ((fe, fi), (re_, ri)):
            b = collate([enc[i] for i in idx], pad)
            if labels_only:
                loss = loss + forward_stats(model, b, keep_logits=False).nll.mean()
            else:
                loss = loss + model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return times[1:]


def graddiff(model, tok, forget, retain, steps: int) -> list[float]:
    """Step times of obliviate's GradDiff (ga + nll, rule sum) with the same batch size, seed and optimiser."""
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.train.unlearn import unlearn

    cfg = TrainConfig(max_steps=steps, batch_size=8, lr=1e-5, progress=False, scheduler="constant",
                      weight_decay=0.0, max_grad_norm=None)
    res = unlearn(model, tok, forget, retain, MethodConfig(forget="ga", retain="nll"), cfg, max_length=256)
    return [h["step_seconds"] for h in res.history[1:]]


def main() -> None:
    args = timing_args(__doc__, data=False)
    import torch

    torch.set_num_threads(1)
    (forget, retain), tok, model = setup(args.hidden, args.layers)
    fresh = lambda: copy.deepcopy(model)  # noqa: E731 - every run starts from the same θ0
    med, counts = interleaved({"floor": lambda: hand_loop(fresh(), tok, forget, retain, args.steps, False),
                               "floor_labels": lambda: hand_loop(fresh(), tok, forget, retain, args.steps, True),
                               "graddiff": lambda: graddiff(fresh(), tok, forget, retain, args.steps)}, args.rounds)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: Llama hidden {args.hidden} x {args.layers} layers, {params / 1e6:.2f}M parameters, vocab "
          f"{model.config.vocab_size}; TOFU forget10/retain90, batch 8+8, 1 thread")
    for k, v in med.items():
        print(f"  median step {k:<13} {v * 1000:8.1f} ms  ({counts[k]} steps)")
    print(f"ratio graddiff / floor        = {med['graddiff'] / med['floor']:.3f}   (target <= 1.05, and < 1)")
    print(f"ratio graddiff / floor_labels = {med['graddiff'] / med['floor_labels']:.3f}   (the loop's own cost)")
    print(f"ratio floor_labels / floor    = {med['floor_labels'] / med['floor']:.3f}   (logits at label positions only)")


if __name__ == "__main__":
    main()
