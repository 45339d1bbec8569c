"""Peak memory of one unlearning step per method against a plain fine-tuning step, at a 128k vocabulary.

Each variant runs in a fresh process (`--child NAME`): build a tiny Llama (hidden 64, 2 layers) whose vocabulary
is Llama-3's 128,256 ids, B forget and B retain rows of exactly 512 tokens (64 prompt + 448 answer), then ONE
optimizer step, and report the process's peak resident memory (`ru_maxrss`) and its resident memory just before
the step. What is compared is the step's own memory, `peak - before`: the tensors one step holds at once (logits,
log-softmaxes, KL terms, gradients, AdamW state, the frozen θ0 and its caches), with the model and the Python
runtime already in place. Every child runs with MALLOC_MMAP_THRESHOLD_=131072: glibc then maps every block over
128 KiB on its own and returns it when torch frees it, so resident memory follows the live tensors; with glibc's
default (a threshold that rises to 32 MiB) freed blocks under 32 MiB stay resident and the figure would measure
the allocator's fragmentation instead. On a GPU (`--device cuda`) it is `torch.cuda.max_memory_allocated()` over the step.

The floor, `plain`, is what anyone writes by hand: Hugging Face's causal-LM loss (`model(..., labels=...).loss`)
on the forget batch plus the same on the retain batch, one backward, torch AdamW. A second, tighter floor,
`finetune`, is obliviate's own fine-tuning step (`finetune`, NLL on the same 2B rows in one batch, with the same
train settings as the methods, e.g. vocabulary chunks): what a method costs over fine-tuning done as obliviate
does it. Each method is obliviate's
`unlearn` with the method section of its preset in configs/synthetic/ (NPO+SAGO: npo.yaml with the SAGO rule),
`train.max_steps=1`, and otherwise the defaults a user gets (e.g. `method.cache=auto`). Printed: each variant's
step memory in MB and its ratio to `plain`, the target being <= 1.15 (issue 22).

    python benchmarks/step_memory.py                          # every method, batch 4 (about 10 min on 2 cores)
    python benchmarks/step_memory.py --batch 2 --only GA ASU_KL
    python benchmarks/step_memory.py train.vocab_chunk=1024   # with train.vocab_chunk set
    python benchmarks/step_memory.py --processes 2 --only GA ASU_KL              # FSDP over 2 CPU processes
    python benchmarks/step_memory.py --processes 2 --only GA ASU_KL train.vocab_chunk=0   # ... unchunked

With `--processes N`, each variant runs under `torchrun --nproc_per_node N` (gloo on a CPU, one thread per process)
with `train.fsdp=true` (`plain`: the model sharded the same way, `train/fsdp.py`), B rows per process; the figure
is the worst rank's step memory.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128_256  # Llama 3
PROMPT, LENGTH = 64, 512
PRESETS = {  # name -> (preset file in configs/synthetic, overrides)
    "GA": ("grad_ascent", []), "GradDiff": ("graddiff", []), "NPO": ("npo", []), "SimNPO": ("simnpo", []),
    "IdkDPO": ("idk_dpo", []), "RMU": ("rmu", []), "ASU_KL": ("asu_kl", []), "ASU_GD": ("asu_gd", []),
    "NPO+SAGO": ("npo", ["method.combine.rule=sago"]),
}


def rss_mb() -> float:
    """Resident memory now, MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    """Peak resident memory of this process so far, MB (ru_maxrss is in KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rows(n: int, seed: int, words: list[str]) -> list:
    """n QA rows whose prompt is ~PROMPT tokens and whose answer runs past LENGTH (cut at the right)."""
    import random

    from obliviate.data.rows import QARow

    rng = random.Random(seed)
    return [QARow(question=" ".join(rng.choices(words, k=PROMPT // 2)), answer=" ".join(rng.choices(words, k=LENGTH)))
            for _ in range(n)]


def child(name: str, batch: int, device: str, overrides: list[str]) -> dict:
    """One variant in this process (or in each rank of a torchrun launch: train.fsdp=true): build, step once,
    measure."""
    import torch

    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if sharded:
        from accelerate import Accelerator

        Accelerator(cpu=device == "cpu")  # the process group, before anything is sharded
        overrides = ["train.fsdp=true", *overrides]

    from obliviate.config import RunConfig, load_config
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer
    from obliviate.train.unlearn import unlearn

    torch.manual_seed(0)
    words = [f"w{i}" for i in range(400)]
    tok = train_tokenizer([" ".join(words)] * 4, vocab_size=600)
    model = tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=LENGTH + 8, seed=0)
    model.resize_token_embeddings(VOCAB, mean_resizing=False)
    model.to(device)
    forget, retain = rows(batch, 1, words), rows(batch, 2, words)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_gpu = torch.cuda.memory_allocated()
    before = rss_mb()
    t0 = time.perf_counter()
    if name == "plain":
        if sharded:
            from obliviate.train.fsdp import shard

            shard(model, torch.device(device))
        plain_step(model, tok, forget, retain, batch, device)
    elif name == "finetune":
        from obliviate.train.unlearn import finetune

        train = load_config(RunConfig, None, ["train.max_steps=1", f"train.batch_size={2 * batch}",
                                              "train.progress=false", *overrides]).train
        finetune(model, tok, forget + retain, train, max_length=LENGTH)
    else:
        preset, extra = PRESETS[name]
        cfg = load_config(RunConfig, ROOT / "configs" / "synthetic" / f"{preset}.yaml",
                          [*extra, "train.max_steps=1", f"train.batch_size={batch}", "train.progress=false",
                           *overrides])
        unlearn(model, tok, forget, retain, cfg.method, cfg.train, max_length=LENGTH)
    out = {"name": name, "before_mb": before, "peak_mb": peak_mb(), "seconds": time.perf_counter() - t0}
    out["step_mb"] = out["peak_mb"] - before
    if device == "cuda":
        out["step_mb"] = (torch.cuda.max_memory_allocated() - base_gpu) / 2**20
    return out


def plain_step(model, tok, forget, retain, batch: int, device: str) -> None:
    """Hugging Face's causal-LM loss on the forget batch plus the retain batch, one backward, one AdamW step."""
    import torch

    from obliviate.data.tokenize import collate, pad_id
    from obliviate.train.unlearn import encode_rows

    pad = pad_id(tok)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    loss = 0.0
    for side in (forget, retain):
        b = collate(encode_rows(tok, side, LENGTH)[:batch], pad)
        b = {k: v.to(device) for k, v in b.items()}
        loss = loss + model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"]).loss
    loss.backward()
    opt.step()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4, help="forget rows and retain rows per step (each)")
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (plain always runs)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--processes", type=int, default=1, help="FSDP over this many processes (torchrun; 1: none)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every method (e.g. train.vocab_chunk=1024)")
    args = ap.parse_args()
    if args.processes < 1:
        ap.error("--processes must be >= 1")
    if args.child:
        result = json.dumps(child(args.child, args.batch, args.device, args.overrides))
        if args.child_out:  # one file per rank
            Path(args.child_out, f"rank{os.environ.get('RANK', '0')}.json").write_text(result)
        else:
            print(result)
        return 0
    names = ["plain", "finetune", *(n for n in PRESETS if args.only is None or n in args.only)]
    threads = "1" if args.processes > 1 else os.environ.get("OMP_NUM_THREADS", "2")
    env = {**os.environ, "OMP_NUM_THREADS": threads,
           "MALLOC_MMAP_THRESHOLD_": "131072"}  # glibc: freed tensors go back to the OS (module docstring)
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(args.processes)] if args.processes > 1 else [sys.executable])
    results = []
    for name in names:
        with tempfile.TemporaryDirectory() as ranks:
            extra = ["--child-out", ranks] if args.processes > 1 else []
            proc = subprocess.run([*launch, __file__, "--child", name, "--batch", str(args.batch), "--device",
                                   args.device, *extra, *args.overrides], capture_output=True, text=True, env=env)
            if proc.returncode:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                results.append({"name": name, "failed": proc.stderr.strip().splitlines()[-1:]})
                continue
            if args.processes > 1:  # the worst rank
                per_rank = [json.loads(f.read_text()) for f in sorted(Path(ranks).glob("rank*.json"))]
                results.append({**max(per_rank, key=lambda r: r["step_mb"]), "ranks": len(per_rank)})
            else:
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"  {name}: step {r['step_mb']:.0f} MB ({r['seconds']:.1f} s)", file=sys.stderr, flush=True)
    floor = next(r["step_mb"] for r in results if r["name"] == "plain")
    own = next((r["step_mb"] for r in results if r["name"] == "finetune" and "step_mb" in r), float("nan"))
    where = f"FSDP over {args.processes} processes, per rank" if args.processes > 1 else "one process"
    print(f"one step at vocabulary {VOCAB:,}, {args.batch}+{args.batch} rows x {LENGTH} tokens, {args.device}, {where}; "
          f"overrides: {' '.join(args.overrides) or 'none'}")
    print(f"{'variant':10} {'step MB':>9} {'peak MB':>9} {'/ plain':>8} {'/ finetune':>11}")
    for r in results:
        if "failed" in r:
            print(f"{r['name']:10} failed: {r['failed']}")
            continue
        print(f"{r['name']:10} {r['step_mb']:9.0f} {r['peak_mb']:9.0f} {r['step_mb'] / floor:8.2f} "
              f"{r['step_mb'] / own:11.2f}")
    methods = [r["step_mb"] for r in results if "failed" not in r and r["name"] in PRESETS]
    print(f"worst method / plain: {max(methods, default=float('nan')) / floor:.2f} (target <= 1.15); "
          f"/ obliviate's own fine-tuning step: {max(methods, default=float('nan')) / own:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"batch": args.batch, "vocab": VOCAB, "length": LENGTH,
                                               "overrides": args.overrides, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
