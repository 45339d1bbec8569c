"""Step time of ASU_KL with a live vs a cached θ0 (teacher + reference), against GradDiff, in one run.

Prints the ratios issue 11 item 2 targets:
  asu_kl(cached) / graddiff      -> target <= 1.05
  asu_kl(cached) / asu_kl(live)  (and live / graddiff, the cost the cache removes)
Same setup as sago_overhead.py (Llama hidden x layers, BPE vocab 2048, TOFU forget10/retain90, batch
8+8, 1 thread). Every run starts from the same seed, so every run sees the same batches; the cache is
filled by one untimed warm-up run and then reused by every cached run through a `CachePool` (θ0 is the same
model; a sweep's trials share θ0's caches the same way), so the
cached figures are the steady state of epochs 2+. Variants interleaved in rounds; median step time
per variant (the first step of each run is dropped). Usage: python benchmarks/cached_teacher.py
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sago_overhead import interleaved, setup, timing_args

VARIANTS = {"graddiff": {"forget": "ga", "retain": "nll"},
            "asu_kl_live": {"forget": "asu", "forget_args": {"tau": 2.0}, "retain": "kl", "cache": "none"},
            "asu_kl_cached": {"forget": "asu", "forget_args": {"tau": 2.0}, "retain": "kl", "cache": "exact"}}


def run_variant(name: str, steps: int, state: tuple, pool: dict) -> list[float]:
    """Step times of one run; cached runs share `pool` (the same data and θ0: its stored entries are valid)."""
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.train.unlearn import unlearn

    (forget, retain), tok, model = state
    cfg = TrainConfig(max_steps=steps, batch_size=8, lr=1e-5, progress=False, scheduler="constant")
    res = unlearn(copy.deepcopy(model), tok, forget, retain, MethodConfig(**VARIANTS[name]), cfg, max_length=256,
                  cache_pool=pool)
    return [h["step_seconds"] for h in res.history[1:]]


def main() -> None:
    args = timing_args(__doc__)
    import torch

    torch.set_num_threads(1)
    state = setup(args.hidden, args.layers, args.data)
    from obliviate.modeling.cache import CachePool

    pool = CachePool()  # what a sweep's trials share (train/unlearn.py `cache_pool`)
    run_variant("asu_kl_cached", args.steps, state, pool)  # warm-up: fills the cache with the timed runs' examples
    stored = sum(len(c.store) for c in pool.values())
    med, counts = interleaved({name: (lambda name=name: run_variant(name, args.steps, state, pool))
                               for name in VARIANTS}, args.rounds)
    params = sum(p.numel() for p in state[2].parameters())
    print(f"model: Llama hidden {args.hidden} x {args.layers} layers, {params / 1e6:.2f}M parameters, vocab "
          f"{state[2].config.vocab_size}; {args.data} forget10/retain90, batch 8+8, 1 thread; {stored} cached entries")
    for k, v in med.items():
        print(f"  median step {k:<14} {v * 1000:8.1f} ms  ({counts[k]} steps)")
    print(f"ratio asu_kl(cached) / graddiff     = {med['asu_kl_cached'] / med['graddiff']:.3f}   (target <= 1.05)")
    print(f"ratio asu_kl(live)   / graddiff     = {med['asu_kl_live'] / med['graddiff']:.3f}")
    print(f"ratio asu_kl(cached) / asu_kl(live) = {med['asu_kl_cached'] / med['asu_kl_live']:.3f}")


if __name__ == "__main__":
    main()
