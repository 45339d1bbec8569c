"""The offline demo: synthetic world -> retain and target models -> ASU_KL and GradDiff -> evaluation.

Everything is real: a BPE tokenizer and a Llama-architecture model trained here on the synthetic
world, real unlearning runs and every TOFU metric. The retain model (trained without the forget
authors) is trained first; the target model continues from it on the full split, so both share
everything but the forget authors and the demo needs one long training run, not two.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from obliviate.config import EvalConfig, MethodConfig, TinyConfig, TrainConfig, build, section, to_dict
from obliviate.config.fields import require, setting

# torch and everything built on it are imported inside the functions that run the demo, so that the CLI
# checks a demo config (unknown keys, bad values) without loading them.


@dataclass(frozen=True)
class WorldConfig:
    authors: int = setting(20, "fictitious authors in the full split")
    forget_percent: int = setting(10, "share of authors to forget (a whole number of authors)")
    pretrain_authors: int = setting(0, "other authors added to both models' training data (fluency)")
    seed: int = setting(0, "world seed")

    def __post_init__(self) -> None:
        require(self.authors >= 2, "world.authors", self.authors, ">= 2")
        require(0 < self.forget_percent < 100, "world.forget_percent", self.forget_percent, "in (0, 100)")


@dataclass(frozen=True)
class DemoConfig:
    world: WorldConfig = section(WorldConfig(), "the synthetic world")
    tiny: TinyConfig = section(TinyConfig(), "the from-scratch model")
    base_model: str | None = setting(None, "a pretrained model (directory, hub id, .gguf or alias such as "
                                      "smollm2-135m-instruct) fine-tuned on the world instead of a tiny model "
                                      "trained from scratch (full fine-tuning)")
    max_length: int = setting(96, "max tokens per example")
    retain_train: TrainConfig = section(TrainConfig(epochs=25, batch_size=16, lr=3e-3, warmup_ratio=0.05,
                                                    weight_decay=0.0), "training of the retain model")
    target_train: TrainConfig = section(TrainConfig(epochs=10, batch_size=16, lr=1e-3, warmup_ratio=0.05,
                                                    weight_decay=0.0), "target = retain model trained on full")
    unlearn: TrainConfig = section(TrainConfig(epochs=20, batch_size=8, lr=1e-3, scheduler="constant",
                                               weight_decay=0.0), "unlearning runs (the same budget for every method)")
    methods: dict = setting({"ASU_KL": {"forget": "asu", "forget_args": {"tau": 16.0, "layers": [0]}, "retain": "kl"},
                        "GradDiff": {"forget": "ga", "retain": "nll"}},
                       "name -> method section (forget, retain, combine, ...), each unlearned from the target")
    eval: EvalConfig = section(EvalConfig(max_new_tokens=200, batch_size=32), "evaluation of every model")
    output_dir: str = setting("obliviate-demo", "results directory")
    overwrite: bool = setting(False, "replace an existing output_dir")
    audit: bool = setting(True, "attack every unlearned model afterwards (obliviate audit: relearning, quantisation, "
                           "paraphrases, MIA; the target is the 100% reference, the retain model the 0% one) and "
                           "write audit/<method>/")
    threads: int = setting(2, "torch threads for the whole demo, fixed so that float rounding (and so every printed "
                         "digit) does not depend on the machine's core count; 0 = torch's default")
    cpu_kernels: str = setting("avx2", "x86-64 CPU kernels: avx2 (every machine prints the same digits; pinned before torch "
                                  "loads, i.e. when run as `obliviate demo`) or native (this CPU's best, e.g. AVX-512)")

    def __post_init__(self) -> None:
        require(self.threads >= 0, "threads", self.threads, ">= 0 (0 = torch's default)")
        require(self.cpu_kernels in ("avx2", "native"), "cpu_kernels", self.cpu_kernels, "avx2 or native")
        require(bool(self.methods), "methods", self.methods, "a non-empty mapping of name -> method section")
        reserved = {"retain", "target"} & set(self.methods)
        require(not reserved, "methods", sorted(reserved), "named other than 'retain' and 'target'")
        methods = self.method_configs()  # every method section is checked now, with its key in the message
        if not self.base_model:  # the tiny model's depth is known now: ASU's layers must exist in it
            from obliviate.modeling.sources import check_layer_indices

            for name, method in methods.items():
                if isinstance(method.forget_args.get("layers"), list):
                    check_layer_indices(method.forget_args["layers"], self.tiny.layers,
                                        f"methods.{name}.forget_args.layers")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The `methods` mapping as validated MethodConfigs."""
        return {str(name): build(MethodConfig, raw, f"methods.{name}.") for name, raw in self.methods.items()}


def preflight_demo(cfg: DemoConfig, *, need_output: bool = True) -> list[str]:
    """Checks of `obliviate demo` before anything trains (also `obliviate validate`): the output directory, the
    base model's files, every method's objective, rule and hyper-parameters; lines for `validate`."""
    from obliviate.files import check_output_dir
    from obliviate.modeling.sources import check_model_source
    from obliviate.train.unlearn import resolve_method

    if need_output or cfg.output_dir:
        check_output_dir(cfg.output_dir, cfg.overwrite)
    lines = [f"world: {cfg.world.authors} authors, forget {cfg.world.forget_percent}%, seed {cfg.world.seed}"]
    if cfg.base_model:
        lines.append("base model: " + check_model_source(cfg.base_model, "base_model"))
    else:
        lines.append(f"model: a tiny Llama trained here ({cfg.tiny.layers} layers, hidden {cfg.tiny.hidden_size})")
    for name, method in cfg.method_configs().items():
        rm = resolve_method(method)  # unknown objectives, rules and hyper-parameters
        lines.append(f"method {name}: {method.forget} + {method.retain or 'no retain term'}, rule {rm.rule.name}")
    return lines


def demo_claims(runs: dict[str, Any]) -> list[tuple[str, bool]]:
    """The demo's story as checks on its own results: (claim, holds). A claim about a model the run lacks is left
    out, and a metric the run could not compute makes its claim fail. Thresholds: the target knows >= 80% of the
    forget facts and the retain model <= 10%; ASU_KL keeps <= 60% of the target's fact recall, model utility within
    0.05 of the target's and fluent answers (<= 10% degenerate, token entropy >= 0.9); GradDiff keeps <= 5% fact
    recall with broken answers (>= 50% degenerate or token entropy <= 0.75: "sssssau" is one word, so entropy is
    what catches it) and lower utility than ASU_KL."""
    nan = float("nan")
    m = {name: {k: nan if v is None else v for k, v in run["metrics"].items()} for name, run in runs.items()}
    out: list[tuple[str, bool]] = []
    if {"retain", "target"} <= set(m):
        out.append(("the target knows the forget facts and the retain model does not",
                    m["target"]["forget_fact_recall"] >= 0.8 and m["retain"]["forget_fact_recall"] <= 0.1))
    if {"target", "ASU_KL"} <= set(m):
        t, a = m["target"], m["ASU_KL"]
        out.append(("ASU_KL forgets facts, keeps model utility and fluent answers",
                    a["forget_fact_recall"] <= 0.6 * t["forget_fact_recall"]
                    and a["model_utility"] >= t["model_utility"] - 0.05
                    and a["forget_degenerate_share"] <= 0.1 and a["forget_token_entropy"] >= 0.9))
    if {"ASU_KL", "GradDiff"} <= set(m):
        a, g = m["ASU_KL"], m["GradDiff"]
        out.append(("GradDiff forgets by breaking the answers and loses more utility",
                    g["forget_fact_recall"] <= 0.05
                    and (g["forget_degenerate_share"] >= 0.5 or g["forget_token_entropy"] <= 0.75)
                    and g["model_utility"] < a["model_utility"]))
    return out


def eval_config(cfg: DemoConfig) -> EvalConfig:
    """The demo's evaluation: the world's forget{p}_perturbed and holdout{p} splits."""
    p = cfg.world.forget_percent
    return EvalConfig(**{**to_dict(cfg.eval), "forget_split": f"forget{p:02d}_perturbed", "holdout_split": f"holdout{p:02d}"})


def card_config(cfg: DemoConfig, name: str, method: MethodConfig) -> Any:
    """The run config an `obliviate unlearn` of the demo's target with `method` would have: what the receipt and
    model card of the demo's unlearned model `name` record (paths as the demo's output directory names them)."""
    from obliviate.config import DataConfig, ModelConfig, RunConfig

    p, out = cfg.world.forget_percent, Path(cfg.output_dir)
    data = DataConfig(source=str(out / "world"), forget_split=f"forget{p:02d}", retain_split=f"retain{100 - p:02d}",
                      max_length=cfg.max_length)
    return RunConfig(model=ModelConfig(path=str(out / "models" / "target")), data=data, method=method,
                     train=cfg.unlearn, eval=eval_config(cfg), output_dir=str(out / "models" / name.lower()))


def card_base(cfg: DemoConfig) -> Any:
    """The base model and licence the cards of the demo's unlearned models declare: the pretrained model's when the
    demo starts from one (`base_model`), else none: the tiny model is trained here from scratch."""
    from obliviate.receipt.card import BaseFacts, base_facts

    if cfg.base_model:
        facts = base_facts(cfg.base_model)
        return BaseFacts(facts.base_model, facts.license, f"{facts.note} The demo fine-tuned it on a synthetic world "
                         "into its target (models/target), the model that was unlearned.")
    return BaseFacts(None, None, "no base model: the demo trained its target (models/target) from scratch on a "
                     "synthetic world, so there is no hub model to declare (set `base_model` to start from one); "
                     "no licence declared.")


def forget_analysis(target: Any, student: Any, tok: Any, rows: list, method: MethodConfig, ml: int) -> dict[str, Any]:
    """Factual vs functional log-prob shift of the unlearned model (and of ASU's teacher) on the forget
    answers, and attention entropy per layer (ASU paper's analyses; obliviate.eval.analysis)."""
    from obliviate.eval.analysis import compare_models, entropy_by_layer
    from obliviate.modeling.smoothing import smoothed_teacher
    from obliviate.modeling.teacher import Teacher

    shift = compare_models(target, student, tok, rows, max_length=ml)
    out = {"token_shift": asdict(shift) | {"selectivity": shift.selectivity},
           "attention_entropy": entropy_by_layer(student, tok, rows, max_length=ml)}
    if method.forget == "asu":
        settings = Teacher.from_args(method.forget_args)
        teacher = smoothed_teacher(target, settings.tau, None if settings.layers is None else list(settings.layers))
        t_shift = compare_models(target, teacher, tok, rows, max_length=ml)
        out["teacher_token_shift"] = asdict(t_shift) | {"selectivity": t_shift.selectivity}
        out["teacher_attention_entropy"] = entropy_by_layer(teacher, tok, rows, max_length=ml)
    return out


def _audit(student: Any, target: Any, retain_model: Any, tok: Any, world_dir: Path, p: int, out: Path,
           log: Any) -> dict[str, Any]:
    """`obliviate audit` of one unlearned model on the world (target = 100%, retain model = 0%); reports in `out`."""
    from obliviate.audit.core import run_audit
    from obliviate.audit.run import load_audit_data, write_audit
    from obliviate.config.audit import AuditConfig

    cfg = AuditConfig(data=str(world_dir), forget_split=f"forget{p:02d}")
    forget, retain, holdout, notes = load_audit_data(cfg)
    res = run_audit(student, target, tok, forget, retain_rows=retain, holdout=holdout, retain_model=retain_model,
                    cfg=cfg, log=lambda s: None)
    res.notes[:0] = notes
    log(f"audit of {out.name} (recovered share of the forgotten facts per attack):\n{res.table()}")
    out.mkdir(parents=True, exist_ok=True)
    write_audit(out, res, cfg, model=f"models/{out.name}", original="models/target", retain_model="models/retain",
                data="world")
    return {"k_metric": res.k_metric, "verdict": res.verdict, "seconds": res.seconds}


def phases(log: Any) -> Any:
    """A logger of elapsed seconds per phase."""
    last = [time.perf_counter()]

    def phase(what: str) -> None:
        now = time.perf_counter()
        log(f"  {what} ({now - last[0]:.1f} s)")
        last[0] = now

    return phase


# What a machine without AVX-512 runs, forced on every x86-64 machine so that the demo's digits agree across them:
# torch's own vectorised kernels, MKL's BLAS (its conditional numerical reproducibility branch) and oneDNN.
AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}


def pin_cpu_kernels() -> bool:
    """Pin the CPU kernels to AVX2 for this process (variables already set by the user are kept); only effective
    before torch loads, so `obliviate demo` calls it first. True when the pin can take effect."""
    import os
    import platform
    import sys

    if "torch" in sys.modules or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    for key, value in AVX2_KERNELS.items():
        os.environ.setdefault(key, value)
    return True


def cpu_kernels() -> str:
    """The instruction set torch's CPU kernels run with, and MKL's reproducibility branch (recorded with the digits)."""
    import os

    import torch

    return f"{torch.backends.cpu.get_cpu_capability()} (MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')})"


def _train_models(cfg: DemoConfig, world: Any, log: Any) -> tuple[Any, Any, Any]:
    """(tokenizer, target, retain model): the retain model is trained on the retain split, then the target
    continues from it on the full split (module docstring); a base model replaces the tiny one."""
    from obliviate.data.synthetic import corpus_texts
    from obliviate.modeling.frozen import frozen_copy
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer
    from obliviate.train.unlearn import finetune

    p = cfg.world.forget_percent
    general = world.splits["real_authors"] + world.splits["world_facts"] + world.splits["pretrain"]
    if cfg.base_model:
        from obliviate.modeling.load import load_pretrained

        model, tok = load_pretrained(cfg.base_model)
    else:
        tok = train_tokenizer(corpus_texts(world), vocab_size=cfg.tiny.vocab_size)
        model = tiny_llama(tok, hidden_size=cfg.tiny.hidden_size, num_layers=cfg.tiny.layers,
                           num_heads=cfg.tiny.heads, seed=cfg.tiny.seed)
    log(f"world: {cfg.world.authors} authors ({len(world.splits['full'])} QA), forget{p:02d} = "
        f"{len(world.splits[f'forget{p:02d}'])} QA; model: {sum(x.numel() for x in model.parameters()):,} parameters")
    ml = cfg.max_length
    finetune(model, tok, world.splits[f"retain{100 - p:02d}"] + general, cfg.retain_train, max_length=ml,
             desc="retain model")
    retain_model = frozen_copy(model)
    finetune(model, tok, world.splits["full"] + general, cfg.target_train, max_length=ml, desc="target model")
    return tok, model, retain_model


def _model_settings(cfg: DemoConfig) -> dict[str, Any]:
    """What the world and its two models depend on (a saved pair is reused only for the same settings)."""
    keys = ("world", "tiny", "base_model", "max_length", "retain_train", "target_train", "threads", "cpu_kernels")
    return {k: v for k, v in to_dict(cfg).items() if k in keys}


def world_models(cfg: DemoConfig, directory: Path, log: Any = print) -> tuple[Any, Path, Any, Any, Any]:
    """(world, world directory, tokenizer, target, retain model) of a demo config, built once and kept in
    `directory` (world/, target/, retain/, settings.json): a later call with the same settings loads them."""
    import json

    import torch

    from obliviate.data.synthetic import make_world, write_world
    from obliviate.modeling.load import atomic_dir, load_pretrained, save_model

    settings = _model_settings(cfg)
    world = make_world(cfg.world.authors, seed=cfg.world.seed, n_pretrain=cfg.world.pretrain_authors,
                       forget_percents=(cfg.world.forget_percent,))
    marker = directory / "settings.json"
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == json.loads(json.dumps(settings)):
        target, tok = load_pretrained(str(directory / "target"))
        retain_model, _ = load_pretrained(str(directory / "retain"))
        log(f"  reused the world and its models in {directory}")
        return world, directory / "world", tok, target.eval(), retain_model.eval()
    with threads(cfg.threads):
        torch.manual_seed(cfg.world.seed)
        tok, target, retain_model = _train_models(cfg, world, log)
    with atomic_dir(directory, overwrite=True) as out:
        write_world(world, out / "world")
        save_model(out / "target", target, tok)
        save_model(out / "retain", retain_model, tok)
        (out / "settings.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
    return world, directory / "world", tok, target.eval(), retain_model.eval()


def run_demo(cfg: DemoConfig, log: Any = print) -> dict[str, Any]:
    """Run the whole story and write results.json, report.md, the world and the models."""
    with threads(cfg.threads):
        return _run_demo(cfg, log)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's thread count set to `n` (0: left as it is) inside the block, restored after it."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_demo(cfg: DemoConfig, log: Any) -> dict[str, Any]:
    """The demo's body (run_demo fixes the thread count around it)."""
    import torch

    from obliviate.data.synthetic import make_world, write_world
    from obliviate.eval.analysis import entropy_by_layer
    from obliviate.eval.runner import evaluate_model, forget_truth_ratios, load_eval_splits
    from obliviate.files import write_json
    from obliviate.modeling.frozen import frozen_copy
    from obliviate.modeling.load import atomic_dir, save_model
    from obliviate.receipt import model_hashes, write_receipt
    from obliviate.report.html import write_html
    from obliviate.report.markdown import console_table, write_report
    from obliviate.train.unlearn import unlearn

    t0 = time.perf_counter()
    preflight_demo(cfg)
    torch.manual_seed(cfg.world.seed)
    p = cfg.world.forget_percent
    world = make_world(cfg.world.authors, seed=cfg.world.seed, n_pretrain=cfg.world.pretrain_authors, forget_percents=(p,))
    with atomic_dir(cfg.output_dir, cfg.overwrite) as out:
        world_dir = write_world(world, out / "world")
        phase = phases(log)
        tok, target, retain_model = _train_models(cfg, world, log)
        ml = cfg.max_length
        runs: dict[str, Any] = {}
        phase("trained retain and target models")
        ev = eval_config(cfg)
        splits = load_eval_splits(str(world_dir), ev)
        retain_tr = forget_truth_ratios(retain_model, tok, splits["forget"], ev, ml)
        kw = {"source": str(world_dir), "retain_model": retain_model}
        for name, m in (("retain", retain_model), ("target", target)):
            runs[name] = {"metrics": evaluate_model(m, tok, splits, ev, retain_tr, ml, **kw)}
        phase("evaluated retain and target models")
        forget_rows, retain_rows = world.splits[f"forget{p:02d}"], world.splits[f"retain{100 - p:02d}"]
        students, trained = {}, {}
        theta0 = model_hashes(target)
        for name, method in cfg.method_configs().items():
            student = frozen_copy(target)
            for prm in student.parameters():
                prm.requires_grad_(True)
            res = unlearn(student, tok, forget_rows, retain_rows, method, cfg.unlearn, max_length=ml)
            runs[name] = {"metrics": evaluate_model(student, tok, splits, ev, retain_tr, ml, **kw),
                          "history": res.history, "train_seconds": res.seconds, "method": to_dict(method)}
            runs[name]["analysis"] = forget_analysis(target, student, tok, splits["forget"], method, ml)
            save_model(out / "models" / name.lower(), student, tok)
            students[name], trained[name] = student, (method, res)
            phase(f"{name}: unlearned in {res.seconds:.1f} s and evaluated")
        runs["target"]["analysis"] = {"attention_entropy": entropy_by_layer(target, tok, splits["forget"], max_length=ml)}
        save_model(out / "models" / "target", target, tok)
        save_model(out / "models" / "retain", retain_model, tok)
        if cfg.audit:
            for name, student in students.items():
                runs[name]["audit"] = _audit(student, target, retain_model, tok, world_dir, p, out / "audit" / name.lower(),
                                             log)
                phase(f"{name}: audited")
        base = card_base(cfg)
        for name, (method, res) in trained.items():  # after the audits: each card and receipt carries its verdict
            write_receipt(out / "models" / name.lower(), card_config(cfg, name, method), tok, forget_rows, retain_rows,
                          theta0, {"eval": runs[name]["metrics"], "history": res.history,
                                   "train_seconds": res.seconds}, base, runs[name].get("audit"))
        results = {"config": to_dict(cfg), "runs": runs, "questions": [r.question for r in splits["forget"]],
                   "answers": [r.answer for r in splits["forget"]], "seconds": time.perf_counter() - t0,
                   "claims": [{"claim": c, "holds": ok} for c, ok in demo_claims(runs)], "cpu_kernels": cpu_kernels()}
        write_json(out / "results.json", results)
        write_report(out / "report.md", results)
        write_html(out / "report.html", results)
    log(console_table(results))
    for item in results["claims"]:
        log(f"  {'holds' if item['holds'] else 'does NOT hold'}: {item['claim']}")
    log(f"  CPU kernels: {results['cpu_kernels']}")
    log(f"results: {Path(cfg.output_dir) / 'results.json'}, report: {Path(cfg.output_dir) / 'report.md'} "
        f"and report.html  "
        f"({results['seconds']:.0f} s)")
    return results
