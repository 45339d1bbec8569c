"""Step time and peak memory of SAGO against the `sum` rule, measured in one run on one model.

Prints the ratios the SAGO issue targets:
  sago / sum(two backward)   (same arithmetic: forget and retain backward separately) -> target <= 1.05
  sago / sum(fused)          (one backward of γ·L_F + α·L_R over the same batches)    -> target <= 1.15
  peak-memory ratio sago / sum(fused): growth above the pre-training level, each variant in a fresh
  subprocess (sampled RSS on CPU, torch.cuda.max_memory_allocated on a GPU).
Timing: variants interleaved in rounds; the median step time per variant over all rounds (the
machine is shared, single steps can spike). Usage: python benchmarks/sago_overhead.py [--rounds 4]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable

VARIANTS = {"sum_fused": ("sum", False), "sum_two_backward": ("sum", True), "sago": ("sago", True)}


TOFU = "tofu"  # the copy shipped with obliviate (data.source=tofu)


def setup(hidden: int, layers: int, data: str = "tofu"):
    """A Llama (hidden x layers) with a BPE tokenizer on TOFU forget10/retain90 (or the synthetic world)."""
    from obliviate.data.rows import load_split
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    if data == "tofu":
        forget, retain = load_split(TOFU, "forget10"), load_split(TOFU, "retain90")
    else:
        from obliviate.data.synthetic import make_world

        world = make_world(40, seed=0, forget_percents=(10,))
        forget, retain = world.splits["forget10"], world.splits["retain90"]
    tok = train_tokenizer([t for r in forget + retain for t in (r.question, r.answer)], vocab_size=2048)
    model = tiny_llama(tok, hidden_size=hidden, num_layers=layers, num_heads=8, seed=0)
    return (forget, retain), tok, model


def run_variant(name: str, steps: int, hidden: int, layers: int, state: tuple | None = None,
                data: str = "tofu") -> list[float]:
    """Step times of `steps` unlearning steps (ASU_GD) with the variant's rule and backward mode."""
    import copy

    from obliviate.config import CombineConfig, MethodConfig, TrainConfig
    from obliviate.train.unlearn import unlearn

    (forget, retain), tok, model = state or setup(hidden, layers, data)
    rule, separate = VARIANTS[name]
    method = MethodConfig(forget="asu", forget_args={"tau": 2.0}, retain="nll",
                          combine=CombineConfig(rule=rule, separate_backward=separate))
    cfg = TrainConfig(max_steps=steps, batch_size=8, lr=1e-5, progress=False, scheduler="constant")
    res = unlearn(copy.deepcopy(model), tok, forget, retain, method, cfg, max_length=256)
    return [h["step_seconds"] for h in res.history[1:]]  # the first step warms up allocators


def training_peak_mb(name: str, steps: int, hidden: int, layers: int, data: str) -> float:
    """Peak memory growth (MB) while training one variant, above the memory held before training.

    GPU: torch.cuda.max_memory_allocated. CPU: resident set size sampled every 2 ms by a thread
    (psutil), minus the RSS after setup, so data loading and tokenizer training do not mask it.
    """
    import threading

    import psutil
    import torch

    state = setup(hidden, layers, data)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run_variant(name, steps, hidden, layers, state, data)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    proc, peak, stop = psutil.Process(), [0], threading.Event()
    base = proc.memory_info().rss

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    run_variant(name, steps, hidden, layers, state, data)
    stop.set()
    thread.join()
    return (peak[0] - base) / 2**20


def peak_memory(name: str, steps: int, hidden: int, layers: int, data: str) -> float:
    """`training_peak_mb` of one variant in a fresh process (so allocator caches do not carry over)."""
    code = (f"import sys; sys.path.insert(0, {repr(sys.path[0])}); import sago_overhead as b, torch, json;"
            f"torch.set_num_threads(1); print(json.dumps(b.training_peak_mb({name!r}, {steps}, {hidden}, "
            f"{layers}, {data!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def timing_args(doc: str, data: bool = True) -> argparse.Namespace:
    """The step-time benchmarks' common flags: --rounds, --steps, --hidden, --layers (and --data)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=9, help="steps per variant per round (the first is dropped)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    if data:
        ap.add_argument("--data", choices=("tofu", "synthetic"), default="tofu",
                        help="TOFU forget10/retain90 (answers ~50 tokens) or the synthetic world (~15 tokens)")
    return ap.parse_args()


def interleaved(variants: dict[str, Callable[[], list[float]]], rounds: int) -> tuple[dict[str, float], dict[str, int]]:
    """Run every variant once per round, in turn (machine noise hits all alike); (median step time, steps) each."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            times[name] += run()
    return {k: statistics.median(v) for k, v in times.items()}, {k: len(v) for k, v in times.items()}


def main() -> None:
    args = timing_args(__doc__)
    import torch

    torch.set_num_threads(1)
    state = setup(args.hidden, args.layers, args.data)
    params = sum(p.numel() for p in state[2].parameters())
    med, counts = interleaved({name: (lambda name=name: run_variant(name, args.steps, args.hidden, args.layers, state))
                               for name in VARIANTS}, args.rounds)
    mem = {k: peak_memory(k, 4, args.hidden, args.layers, args.data) for k in ("sum_fused", "sago")}
    print(f"model: Llama hidden {args.hidden} x {args.layers} layers, {params / 1e6:.2f}M parameters; "
          f"ASU_GD on {args.data} forget10/retain90, batch 8+8, 1 thread")
    for k, v in med.items():
        print(f"  median step {k:<17} {v * 1000:8.1f} ms  ({counts[k]} steps)")
    print(f"ratio sago / sum(two backward) = {med['sago'] / med['sum_two_backward']:.3f}   (target <= 1.05)")
    print(f"ratio sago / sum(fused)        = {med['sago'] / med['sum_fused']:.3f}   (target <= 1.15)")
    unit = "MB allocated above the pre-training level (GPU)" if torch.cuda.is_available() else \
        "MB peak RSS growth during training (CPU)"
    print(f"peak memory sum(fused) {mem['sum_fused']:.1f}, sago {mem['sago']:.1f} {unit}; "
          f"ratio {mem['sago'] / mem['sum_fused']:.3f}; one extra gradient copy = {params * 4 / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
