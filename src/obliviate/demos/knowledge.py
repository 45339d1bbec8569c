"""The real-model demo (`obliviate demo --config configs/demo_real.yaml`): a pretrained model forgets a
family of facts it knows, and we measure what goes (forget accuracy), what stays (neighbours, retain,
held-out, MCQ) and how it speaks (fluency), for ASU and the baselines with the same optimiser and steps.

Steps: load the model (a GGUF alias converts once into the cache) -> probe every fact (greedy) -> group
the known ones (eval/knowledge.py) -> optionally calibrate ASU's τ/layers with the teacher alone ->
unlearn each method from the same θ0 -> evaluate, analyse factual vs functional tokens and attention
entropy -> results.json, report.md, report.html and the groups as JSONL.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from obliviate.audit.core import run_audit
from obliviate.config import LoraSettings, MethodConfig, to_dict
from obliviate.config.audit import AuditConfig
from obliviate.demos.offline import forget_analysis, phases
from obliviate.errors import ObliviateError
from obliviate.eval.analysis import calibrate, default_layer_sets, entropy_by_layer
from obliviate.eval.knowledge import (
    KNOWLEDGE_COLUMNS,
    KnowledgeSplit,
    evaluate_knowledge,
    family_table,
)
from obliviate.files import write_json
from obliviate.modeling.load import atomic_dir
from obliviate.modeling.teacher import Teacher
from obliviate.report.html import write_html
from obliviate.report.markdown import calibration_table, console_table, write_report
from obliviate.setups.knowledge import KnowledgeDemoConfig, preflight_knowledge, probe_and_split, write_groups
from obliviate.train.student import load_model, student_copy
from obliviate.train.unlearn import unlearn


def _calibration(model: Any, tok: Any, rows: list, cfg: KnowledgeDemoConfig) -> dict[str, Any]:
    c = cfg.calibrate
    sets = c.layer_sets if c.layer_sets is not None else default_layer_sets(model.config.num_hidden_layers)
    return calibrate(model, tok, rows, [float(t) for t in c.taus], sets, functional_budget=c.functional_budget,
                     min_factual=c.min_factual, max_length=cfg.max_length)


def _auto_setting(model: Any, tok: Any, rows: list, cfg: KnowledgeDemoConfig) -> tuple[dict | None, dict[str, Any]]:
    """(calibration result, the τ/layers for `tau: auto`) — no sweep when no method asks for it."""

    if not cfg.needs_calibration():
        return None, Teacher().as_args()
    calibration = _calibration(model, tok, rows, cfg)
    best = calibration["recommended"]
    if best is None:
        raise ObliviateError(f"calibration found no admissible tau/layers ({calibration['note']}); "
                             "set a tau instead of auto or widen calibrate.taus")
    return calibration, Teacher.from_args(best).as_args()


def _unlearn_and_evaluate(model: Any, tok: Any, split: KnowledgeSplit, method: MethodConfig,
                          cfg: KnowledgeDemoConfig) -> dict[str, Any]:
    """One method from θ0: train a student, evaluate it, analyse its forget answers."""

    torch.manual_seed(cfg.seed)
    student = student_copy(model, cfg.model)
    forget_rows = split.train_rows("forget")
    res = unlearn(student, tok, forget_rows, split.train_rows("retain"), method, cfg.unlearn, max_length=cfg.max_length)
    student.eval()
    kc = cfg.knowledge
    out = {"metrics": evaluate_knowledge(student, tok, split, max_new_tokens=kc.max_new_tokens, batch_size=kc.batch_size,
                                         max_eval=kc.max_eval, seed=cfg.seed, other_mcq=kc.other_mcq),
           "history": res.history, "train_seconds": res.seconds, "method": to_dict(method),
           "seconds_per_step": res.seconds / max(1, len(res.history)),
           "analysis": forget_analysis(model, student, tok, forget_rows, method, cfg.max_length)}
    if cfg.audit:
        out["audit"] = _audit(student, model, tok, split, cfg)
    return out


def _audit(student: Any, model: Any, tok: Any, split: KnowledgeSplit, cfg: KnowledgeDemoConfig) -> dict[str, Any]:
    """`obliviate audit` of one unlearned student on the known facts: the forget family as the forget rows, the
    retain facts for the few-shot prompt and the relearning control, the held-out facts as MIA non-members."""

    kc = cfg.knowledge
    acfg = AuditConfig(max_new_tokens=kc.max_new_tokens, batch_size=kc.batch_size, max_length=cfg.max_length,
                       probes=["few_shot", "completion"], seed=cfg.seed)
    res = run_audit(student, model, tok, split.train_rows("forget"), retain_rows=split.train_rows("retain"),
                    holdout=split.train_rows("heldout"), cfg=acfg, log=lambda s: None)
    return {**res.to_json(), "table": res.table()}


def _write_results(cfg: KnowledgeDemoConfig, results: dict[str, Any], split: KnowledgeSplit) -> None:
    with atomic_dir(cfg.output_dir, cfg.overwrite) as out:
        write_groups(out / "facts", split)
        write_json(out / "results.json", results)
        write_report(out / "report.md", results)
        write_html(out / "report.html", results, title="obliviate: a pretrained model forgets facts it knows")


def run_knowledge_demo(cfg: KnowledgeDemoConfig, log: Any = print) -> dict[str, Any]:
    """Probe, group, (calibrate,) unlearn every method, evaluate, and write the results directory."""

    t0 = time.perf_counter()
    facts, _ = preflight_knowledge(cfg)
    kc = cfg.knowledge
    phase = phases(log)
    model, tok = load_model(dataclasses.replace(cfg.model, lora=LoraSettings()))  # θ0 plain; students get adapters
    model.eval()
    phase(f"loaded {cfg.model.path} ({sum(p.numel() for p in model.parameters()):,} parameters)")
    replies, split = probe_and_split(model, tok, facts, cfg)
    probe = family_table(facts, replies)
    phase(f"probed {len(facts)} facts: {sum(k for _, k, _ in probe)} known; forget {len(split.forget)}, neighbours "
          f"{len(split.neighbours)}, retain {len(split.retain)}, held out {len(split.heldout)}")
    forget_rows = split.train_rows("forget")
    probe_replies = {f.id: r for f, r in zip(facts, replies)}  # θ0's greedy replies: no second generation
    original = evaluate_knowledge(model, tok, split, max_new_tokens=kc.max_new_tokens, batch_size=kc.batch_size,
                                  max_eval=kc.max_eval, seed=cfg.seed, replies=probe_replies, other_mcq=kc.other_mcq)
    runs: dict[str, Any] = {"original": {"metrics": original, "analysis": {
        "attention_entropy": entropy_by_layer(model, tok, forget_rows, max_length=cfg.max_length)}}}
    phase("evaluated the original model")
    calibration, auto = _auto_setting(model, tok, forget_rows, cfg)
    if calibration:
        phase(f"calibrated: tau={auto['tau']:g}, layers={auto['layers'] if auto['layers'] is not None else 'all'}")
    for name, method in cfg.method_configs(auto).items():
        runs[name] = _unlearn_and_evaluate(model, tok, split, method, cfg)
        phase(f"{name}: unlearned in {runs[name]['train_seconds']:.1f} s ({len(runs[name]['history'])} steps) and evaluated"
              + (f", audited in {runs[name]['audit']['seconds']:.0f} s" if "audit" in runs[name] else ""))
        if "audit" in runs[name]:
            log(f"audit of {name} (share of the forgotten facts each attack brings back):\n{runs[name]['audit']['table']}")
    results = {"config": to_dict(cfg), "kind": "knowledge", "runs": runs, "columns": [list(c) for c in KNOWLEDGE_COLUMNS],
               "note": NOTE, "probe": [list(p) for p in probe], "calibration": calibration,
               "groups": {k: [f.id for f in v] for k, v in split.groups().items()},
               "questions": [r.question for r in forget_rows], "answers": [r.answer for r in forget_rows],
               "seconds": time.perf_counter() - t0}
    results["extra_markdown"] = _extra_markdown(results, calibration_table(calibration) if calibration else None)
    _write_results(cfg, results, split)
    log(console_table(results))
    log(f"results: {Path(cfg.output_dir) / 'results.json'}, report.md and report.html ({results['seconds']:.0f} s)")
    return results


NOTE = ("Accuracy: share of facts whose gold answer (or an alias) the greedy reply contains, among the facts the "
        "original model answered correctly (so the original scores 1.000 on every group by construction). "
        "Neighbours: other families' facts about the forget facts' entities (never trained on). MCQ: 4-way "
        "choice, each option put into the original model's own answer sentence, the lowest mean NLL wins (chance "
        "0.25). Fluency columns are over the forget replies.")


def _extra_markdown(results: dict[str, Any], calibration: str | None) -> list[str]:
    """Probe table, timings and the calibration sweep for report.md."""
    lines = ["## What the model knows (probe)", "", "| family | known | asked |", "|---|---|---|"]
    lines += [f"| {fam} | {k} | {n} |" for fam, k, n in results["probe"]]
    lines += ["", "## Training time", "", "| method | steps | seconds | seconds per step |", "|---|---|---|---|"]
    for name, run in results["runs"].items():
        if "history" in run:
            lines.append(f"| {name} | {len(run['history'])} | {run['train_seconds']:.1f} | {run['seconds_per_step']:.2f} |")
    if calibration:
        lines += ["", "## Calibration (teacher alone, on the forget answers)", "", calibration]
    return lines + [""]
