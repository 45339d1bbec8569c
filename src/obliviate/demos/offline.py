"""The offline demo: synthetic world -> retain and target models -> ASU_KL and GradDiff -> evaluation.

Everything is real: a BPE tokenizer and a Llama-architecture model trained here on the synthetic
world, real unlearning runs and every TOFU metric. The retain model (trained without the forget
authors) is trained first; the target model continues from it on the full split, so both share
everything but the forget authors and the demo needs one long training run, not two.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from obliviate.audit.run import load_audit_data, write_audit
from obliviate.config import DataConfig, MethodConfig, ModelConfig, RunConfig, to_dict
from obliviate.config.audit import AuditConfig
from obliviate.data.synthetic import make_world, write_world
from obliviate.files import write_json
from obliviate.modeling.teacher import Teacher
from obliviate.receipt import model_hashes, write_receipt
from obliviate.receipt.card import BaseFacts, base_facts
from obliviate.setups.world import DemoConfig, cpu_kernels, eval_config, preflight_demo, threads, train_models

# torch and everything built on it are imported inside the functions that run the demo, so that the CLI
# checks a demo config (unknown keys, bad values) without loading them.


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


def card_config(cfg: DemoConfig, name: str, method: MethodConfig) -> Any:
    """The run config an `obliviate unlearn` of the demo's target with `method` would have: what the receipt and
    model card of the demo's unlearned model `name` record (paths as the demo's output directory names them)."""

    p, out = cfg.world.forget_percent, Path(cfg.output_dir)
    data = DataConfig(source=str(out / "world"), forget_split=f"forget{p:02d}", retain_split=f"retain{100 - p:02d}",
                      max_length=cfg.max_length)
    return RunConfig(model=ModelConfig(path=str(out / "models" / "target")), data=data, method=method,
                     train=cfg.unlearn, eval=eval_config(cfg), output_dir=str(out / "models" / name.lower()))


def card_base(cfg: DemoConfig) -> Any:
    """The base model and licence the cards of the demo's unlearned models declare: the pretrained model's when the
    demo starts from one (`base_model`), else none: the tiny model is trained here from scratch."""

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


def run_demo(cfg: DemoConfig, log: Any = print) -> dict[str, Any]:
    """Run the whole story and write results.json, report.md, the world and the models."""
    with threads(cfg.threads):
        return _run_demo(cfg, log)


def _run_demo(cfg: DemoConfig, log: Any) -> dict[str, Any]:
    """The demo's body (run_demo fixes the thread count around it)."""
    import torch

    from obliviate.eval.analysis import entropy_by_layer
    from obliviate.eval.runner import evaluate_model, forget_truth_ratios, load_eval_splits
    from obliviate.modeling.frozen import frozen_copy
    from obliviate.modeling.load import atomic_dir, save_model
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
        tok, target, retain_model = train_models(cfg, world, log)
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
