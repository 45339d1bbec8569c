"""`obliviate eval` against the reference framework's TOFU evaluation (open-unlearning), whole process each.

    python benchmarks/eval_vs_reference.py --reference PATH/TO/open-unlearning [--rounds 2] [--model DIR]

Both evaluate the same model on TOFU forget01 (+ holdout01, retain, real authors, world facts) with the same
generation length (200 new tokens) and the same tokens: the reference's phi-1_5 template for a model without a chat
template ("Question: " + q + "\\n" + "Answer: ", then the answer; prompt + answer tokenised together, the prompt's
own token count masked) is obliviate's `model.chat.prompt_template="Question: {question}\\nAnswer: "`, which
encodes exactly so; forget quality from the same retain log; each with its own default batch size (the reference
32, obliviate `eval.batch_size=auto`: generation rows from the KV cache budget, answers scored by padded tokens).
The model is a tiny Llama (hidden 128, 2 layers, a 2,048-id BPE tokenizer trained on TOFU), fine-tuned by
`obliviate finetune` on TOFU's full split for --finetune-steps steps (default 150) so that its answers share
words with the gold ones and ROUGE and model utility are not all zero, unless --model names one.

The reference runs in a virtualenv of its own with the versions it pins (transformers 4.45.1, datasets 3.0.1,
accelerate 0.34.2, hydra-core 1.3, deepspeed 0.15.4, lm-eval 0.4.8, ...) and this environment's torch version (so
pip takes the same build); `--venv` (default <tmp>/obliviate-open-unlearning-venv) is made on the first run (a
few minutes) and found afterwards; this environment is not touched. It has no network here, so its
`load_dataset("locuslab/TOFU", name, split)` is served from obliviate's shipped copy of the same files by a
`sitecustomize` shim on its PYTHONPATH (a JSON load of the same rows; nothing else changes).

A first, untimed reference run writes its TOFU_EVAL.json: the retain log both then use for forget quality
(`retain_logs_path`, `eval.retain_reference`), and it fills the datasets cache. Then `--rounds` rounds, each timing
both whole commands (the order alternates); printed: each run's wall time, the medians, their ratio (issue 22's
target: obliviate <= 0.3x the reference) and every aggregate metric of the reference's TOFU_EVAL.json beside
obliviate's; the exit status is 1 when any differs by more than 1e-5 (absolute; the relative difference is printed
too) or is missing on one side.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOFU = ROOT / "src" / "obliviate" / "resources" / "tofu"
PINS = ["transformers==4.45.1", "huggingface-hub==0.29.1", "hydra-core==1.3", "hydra_colorlog==1.2.0",
        "datasets==3.0.1", "accelerate==0.34.2", "rouge-score==0.1.2", "scipy==1.14.1", "scikit-learn==1.5.2",
        "numpy<2.3", "tensorboard", "deepspeed==0.15.4", "lm-eval==0.4.8"]
SHIM = '''"""Serve load_dataset("locuslab/TOFU", name, split) from a local folder of the same splits (no network)."""
import os

_ROOT = os.environ.get("OU_TOFU_DIR")
if _ROOT:
    import datasets

    _real = datasets.load_dataset

    def load_dataset(path=None, name=None, split=None, **kw):
        if path == "locuslab/TOFU":
            return _real("json", data_files=os.path.join(_ROOT, f"{name}.jsonl"), split=split or "train")
        return _real(path, name, split=split, **kw)

    datasets.load_dataset = load_dataset
'''
# The reference's TOFU_EVAL.json metric -> obliviate's eval key (every aggregate both compute).
PAIRS = [("forget_Q_A_Prob", "forget_prob"), ("forget_Q_A_ROUGE", "forget_rougeL_recall"),
         ("forget_truth_ratio", "forget_truth_ratio"), ("extraction_strength", "forget_extraction_strength"),
         ("forget_quality", "forget_quality"), ("privleak", "privleak"), ("mia_min_k", "mia_min_k_auc"),
         ("retain_Q_A_Prob", "retain_prob"), ("retain_Q_A_ROUGE", "retain_rougeL_recall"),
         ("retain_Truth_Ratio", "retain_truth_ratio"),
         ("ra_Q_A_Prob_normalised", "real_authors_prob"), ("ra_Q_A_ROUGE", "real_authors_rougeL_recall"),
         ("ra_Truth_Ratio", "real_authors_truth_ratio"),
         ("wf_Q_A_Prob_normalised", "world_facts_prob"), ("wf_Q_A_ROUGE", "world_facts_rougeL_recall"),
         ("wf_Truth_Ratio", "world_facts_truth_ratio"), ("model_utility", "model_utility")]
TOLERANCE = 1e-5
TEMPLATE = "Question: {question}\nAnswer: "  # the reference's configs/model/phi-1_5.yaml user/assistant tags


def reference_venv(path: Path) -> Path:
    """The reference's virtualenv (made with its pins on first use); returns its python."""
    import torch

    python = path / "bin" / "python"
    if python.exists():
        print(f"reference venv: {path} (found)", flush=True)
        return python
    print(f"reference venv: {path} (building: {' '.join(PINS)}, torch=={torch.__version__.split('+')[0]})", flush=True)
    venv.create(path, with_pip=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"torch=={torch.__version__.split('+')[0]}", *PINS],
                   check=True)
    return python


def tiny_model(directory: Path, finetune_steps: int) -> Path:
    """A Llama (hidden 128, 2 layers) with a BPE tokenizer trained on TOFU's text, fine-tuned on TOFU's full split
    for `finetune_steps` steps (0: random weights) with the reference's prompt format."""
    from obliviate.data.rows import load_split
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    rows = load_split("tofu", "full")
    tok = train_tokenizer([f"{r.question} {r.answer}" for r in rows], vocab_size=2048)
    model = tiny_llama(tok, hidden_size=128, num_layers=2, num_heads=4, max_position_embeddings=512, seed=0)
    save_model(directory / "random", model, tok)
    if not finetune_steps:
        return directory / "random"
    subprocess.run([sys.executable, "-m", "obliviate.cli", "finetune", f"model.path={directory / 'random'}",
                    "data.source=tofu", "data.splits=[full]", f"train.max_steps={finetune_steps}", "train.batch_size=16",
                    "train.lr=3e-3", "train.progress=false", "data.max_length=256",
                    f'model.chat.prompt_template="{TEMPLATE.encode("unicode_escape").decode()}"',
                    f"output_dir={directory / 'finetuned'}", "overwrite=true"], check=True)
    return directory / "finetuned"


def reference_command(python: Path, repo: Path, model: Path, out: Path, retain_log: Path | None) -> list[str]:
    return [str(python), str(repo / "src" / "eval.py"), "experiment=eval/tofu/default", "model=phi-1_5",
            f"model.model_args.pretrained_model_name_or_path={model}", "+model.model_args.attn_implementation=sdpa",
            "+model.model_args.torch_dtype=float32", "model.model_args.device_map=cpu",
            f"model.tokenizer_args.pretrained_model_name_or_path={model}", "forget_split=forget01",
            "holdout_split=holdout01", "task_name=bench", f"paths.output_dir={out}",
            f"retain_logs_path={retain_log}" if retain_log else "retain_logs_path=null"]


def obliviate_command(model: Path, out: Path, retain_log: Path) -> list[str]:
    return [sys.executable, "-m", "obliviate.cli", "eval", f"model.path={model}", "eval.source=tofu",
            "eval.forget_split=forget01_perturbed", "eval.holdout_split=holdout01", f"eval.retain_reference={retain_log}",
            f'model.chat.prompt_template="{TEMPLATE.encode("unicode_escape").decode()}"',
            f"output_dir={out}", "overwrite=true"]


def compare(reference: dict, ours: dict) -> list[str]:
    """Lines of the metric table; the ones whose values differ by more than TOLERANCE (or exist on one side) end
    in 'DIFFERS'."""
    lines = []
    for theirs, mine in PAIRS:
        a = (reference.get(theirs) or {}).get("agg_value")
        b = ours.get(mine)
        if a is None or b is None:
            bad, diff = a is not b, "n/a"
        else:
            bad = abs(a - b) > TOLERANCE
            diff = f"{abs(a - b):.1e} (rel {abs(a - b) / max(abs(a), 1e-30):.1e})"
        lines.append(f"  {theirs:24} {mine:28} reference {a!s:24} obliviate {b!s:24} |diff| {diff}"
                     + ("  DIFFERS" if bad else ""))
    return lines


def timed(cmd: list[str], env: dict | None, cwd: Path | None, log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\nsee {log}")
    return seconds


def main() -> int:
    import os

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, type=Path, help="a checkout of locuslab/open-unlearning")
    ap.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "obliviate-open-unlearning-venv")
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: a tiny random-init Llama)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (>= 1; the first one's metrics are compared)")
    ap.add_argument("--finetune-steps", type=int, default=150, help="fine-tuning of the tiny model (0: random weights)")
    ap.add_argument("--work", type=Path, default=None, help="where runs write (default: a temporary folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="obliviate-eval-vs-reference-"))
    work.mkdir(parents=True, exist_ok=True)
    python = reference_venv(args.venv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1: the first round's metrics are compared")
    model = args.model or tiny_model(work / "model", args.finetune_steps)
    (work / "shim").mkdir(exist_ok=True)
    (work / "shim" / "sitecustomize.py").write_text(SHIM)
    ref_env = {**os.environ, "PYTHONPATH": str(work / "shim"), "OU_TOFU_DIR": str(TOFU), "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / "datasets-cache")}
    warm = timed(reference_command(python, args.reference, model, work / "ref-warm", None), ref_env, args.reference,
                 work / "ref-warm.log")
    retain_log = work / "ref-warm" / "TOFU_EVAL.json"
    print(f"reference warm-up (writes the retain log, fills the datasets cache): {warm:.1f} s", flush=True)
    times: dict[str, list[float]] = {"reference": [], "obliviate": []}
    for r in range(args.rounds):
        order = ["reference", "obliviate"] if r % 2 == 0 else ["obliviate", "reference"]
        for name in order:
            out = work / f"{name}-{r}"
            cmd = (reference_command(python, args.reference, model, out, retain_log) if name == "reference"
                   else obliviate_command(model, out, retain_log))
            times[name].append(timed(cmd, ref_env if name == "reference" else None,
                                     args.reference if name == "reference" else None, work / f"{name}-{r}.log"))
            print(f"  round {r + 1} {name}: {times[name][-1]:.1f} s", flush=True)
    ref, own = statistics.median(times["reference"]), statistics.median(times["obliviate"])
    print(f"model: {model}; TOFU forget01, 200 new tokens, default batch sizes, whole process each, {args.rounds} rounds")
    print(f"median reference {ref:.1f} s, obliviate {own:.1f} s: obliviate / reference = {own / ref:.2f} "
          "(target <= 0.3)")
    ref_metrics = json.loads((work / "reference-0" / "TOFU_EVAL.json").read_text())
    own_metrics = json.loads((work / "obliviate-0" / "metrics.json").read_text())["eval"]
    lines = compare(ref_metrics, own_metrics)
    print("\n".join(lines))
    bad = [ln for ln in lines if ln.endswith("DIFFERS")]
    print(f"every metric within {TOLERANCE:g}" if not bad else f"{len(bad)} metric(s) differ by more than {TOLERANCE:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
