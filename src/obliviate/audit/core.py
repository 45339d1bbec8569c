"""run_audit: attack the unlearned model (relearning, quantisation, indirect prompts, membership inference)
and measure, per attack, how much of the forgotten knowledge comes back (obliviate.audit.verdict)."""
from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from obliviate.audit.probes import (
    Probe,
    answer_probs,
    completion_probe,
    direct_probe,
    few_shot_probe,
    few_shot_shots,
    greedy_from_ids,
    item_scores,
    k_metric,
    mean_k,
    paraphrase_probe,
)
from obliviate.audit.quantize import get_scheme, quantized_copy, unfit_layers
from obliviate.audit.verdict import AttackRow, console_verdict, mark_headlines, recovered_share, share_interval
from obliviate.config import TrainConfig
from obliviate.config.audit import AuditConfig
from obliviate.data.rows import QARow
from obliviate.eval.mia import attack_scores, mia_auc, token_scores
from obliviate.progress import track
from obliviate.train.unlearn import finetune

REF_RETAIN = "retain model under the same attack"
REF_UNLEARNED = "unlearned model without attack"
MIA_ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus")


@dataclass
class AuditResult:
    """What run_audit measured: every attack row, the verdict per attack, K without attack, notes, timing."""

    k_metric: str
    ref0: str
    rows: list[AttackRow]
    verdict: dict[str, Any]
    baseline: dict[str, dict[str, float | None]]
    n_forget: int
    seconds: float
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """The verdict as terminal text."""
        return console_verdict(self.rows, self.ref0)

    def to_json(self) -> dict[str, Any]:
        """Everything, raw shares included (audit.json)."""
        return {"k_metric": self.k_metric, "ref0": self.ref0, "verdict": self.verdict,
                "rows": [r.to_json() for r in self.rows], "baseline": self.baseline, "n_forget": self.n_forget,
                "seconds": self.seconds, "notes": self.notes, "settings": self.settings}


def relearn_split(n: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, eval) row indices: round(share * n) rows (at least 1, at most n - 1) drawn with `seed`."""
    if n < 2:
        raise ValueError(f"relearning needs at least 2 forget rows (train on some, measure the others); got {n}")
    k = min(n - 1, max(1, round(share * n)))
    perm = random.Random(f"{seed}:relearn").sample(range(n), n)
    return sorted(perm[:k]), sorted(perm[k:])


def relearned_copy(model: Any, tokenizer: Any, rows: Sequence[QARow], cfg: AuditConfig) -> Any:
    """A copy of `model` fine-tuned for cfg.relearn_steps steps on `rows` (constant lr, no decay), in eval mode."""

    m = copy.deepcopy(model)
    for p in m.parameters():
        p.requires_grad_(True)
    train = TrainConfig(max_steps=cfg.relearn_steps, batch_size=min(cfg.relearn_batch_size, len(rows)),
                        lr=cfg.relearn_lr, scheduler="constant", weight_decay=0.0, warmup_ratio=0.0,
                        progress=False, seed=cfg.seed)
    finetune(m, tokenizer, list(rows), train, max_length=cfg.max_length, desc="relearn")
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


class _Scorer:
    """K of (model, probe) on the forget rows, each computed once."""

    def __init__(self, tokenizer: Any, rows: Sequence[QARow], metric: str, cfg: AuditConfig) -> None:
        self.tok, self.rows, self.metric, self.cfg = tokenizer, list(rows), metric, cfg
        self.cache: dict[tuple[str, str], np.ndarray] = {}
        self.samples: dict[str, dict[str, str]] = {}

    def fresh(self, model: Any, probe: Probe, rows: Sequence[QARow]) -> tuple[np.ndarray, list[str]]:
        """Per-row K [N] of `model` under `probe` on `rows` (the probe's rows), and the answers; not cached."""
        gens = greedy_from_ids(model, self.tok, probe.prompts, max_new_tokens=self.cfg.max_new_tokens,
                               batch_size=self.cfg.batch_size, max_length=self.cfg.max_length)
        return item_scores(gens, rows, probe, self.metric), gens

    def scores(self, key: str, model: Any, probe: Probe) -> np.ndarray:
        """Per-row K [N] of the model called `key` under `probe` (built on all forget rows), computed once."""
        if (key, probe.name) not in self.cache:
            self.cache[key, probe.name], gens = self.fresh(model, probe, self.rows)
            self.samples.setdefault(f"{key} / {probe.name}", {"prompt_given": probe.given[0], "answer": gens[0]})
        return self.cache[key, probe.name]

    def k(self, key: str, model: Any, probe: Probe, idx: Sequence[int] | None = None) -> float | None:
        """Mean K of `key` under `probe` (over rows `idx` when given)."""
        return mean_k(self.scores(key, model, probe), idx)


def _prob_extra(att: float, orig: float, ref0: float, unl: float) -> dict[str, Any]:
    """Mean answer probability of the same rows, as a second score with its own share."""
    return {"prob": {"attacked": att, "original": orig, "ref0": ref0, "unlearned": unl,
                     "share": recovered_share(att, orig, ref0)}}


def _relearn_rows(models: dict[str, Any], tok: Any, forget: list[QARow], retain: list[QARow], sc: _Scorer,
                  cfg: AuditConfig, log: Callable[[str], None]) -> list[AttackRow]:
    """Relearning on a share of the forget rows, and the retain-only control, measured on the other forget rows."""
    tr, ev = relearn_split(len(forget), cfg.relearn_share, cfg.seed)
    train_rows, eval_rows = [forget[i] for i in tr], [forget[i] for i in ev]
    control = random.Random(f"{cfg.seed}:control").sample(retain, min(len(tr), len(retain)))
    probe = direct_probe(tok, eval_rows)
    pkw = {"batch_size": cfg.batch_size, "max_length": cfg.max_length}
    orig_rows = sc.scores("original", models["original"], direct_probe(tok, forget))[ev]
    unl_rows = sc.scores("unlearned", models["unlearned"], direct_probe(tok, forget))[ev]
    orig_k, unl_k = mean_k(orig_rows), mean_k(unl_rows)
    plain = sc.k("retain", models["retain"], direct_probe(tok, forget), ev) if "retain" in models else unl_k
    orig_p = float(answer_probs(models["original"], tok, eval_rows, **pkw).mean())
    unl_p = float(answer_probs(models["unlearned"], tok, eval_rows, **pkw).mean())
    out = []
    for variant, rows in ((f"forget {len(tr)}/{len(forget)} rows", train_rows), ("retain-only control", control)):
        att = relearned_copy(models["unlearned"], tok, rows, cfg)
        att_rows = sc.fresh(att, probe, eval_rows)[0]
        p_att = float(answer_probs(att, tok, eval_rows, **pkw).mean())
        if "retain" in models:
            ref = relearned_copy(models["retain"], tok, rows, cfg)
            ref_rows = sc.fresh(ref, probe, eval_rows)[0]
            p_ref, ref0 = float(answer_probs(ref, tok, eval_rows, **pkw).mean()), REF_RETAIN
        else:
            ref_rows, p_ref, ref0 = unl_rows, unl_p, REF_UNLEARNED
        k_att = mean_k(att_rows)
        out.append(AttackRow("relearn", variant, sc.metric, len(ev), unl_k, k_att, orig_k, mean_k(ref_rows), ref0,
                             plain, extra=_prob_extra(p_att, orig_p, p_ref, unl_p) | {"train_rows": len(rows),
                                                                                      "steps": cfg.relearn_steps},
                             interval=share_interval(att_rows, orig_rows, ref_rows, seed=cfg.seed)))
        log(f"  relearn ({variant}): K {k_att}")
    return out


def _quantize_rows(models: dict[str, Any], tok: Any, forget: list[QARow], sc: _Scorer, cfg: AuditConfig,
                   log: Callable[[str], None]) -> list[AttackRow]:
    """Each of cfg.quant_schemes applied to the weights of the unlearned model (and of the retain model, the 0%
    reference); one row per scheme, its variant the scheme's name."""

    probe = direct_probe(tok, forget)
    pkw = {"batch_size": cfg.batch_size, "max_length": cfg.max_length}
    orig_k, unl_k = sc.k("original", models["original"], probe), sc.k("unlearned", models["unlearned"], probe)
    plain = sc.k("retain", models["retain"], probe) if "retain" in models else unl_k
    orig_p = float(answer_probs(models["original"], tok, forget, **pkw).mean())
    unl_p = float(answer_probs(models["unlearned"], tok, forget, **pkw).mean())
    out = []
    for name in cfg.quant_schemes:
        q = quantized_copy(models["unlearned"], name, cfg.group_size)
        att_rows, p_att = sc.scores(f"unlearned-{name}", q, probe), float(answer_probs(q, tok, forget, **pkw).mean())
        if "retain" in models:
            qr = quantized_copy(models["retain"], name, cfg.group_size)
            ref_rows, ref0 = sc.scores(f"retain-{name}", qr, probe), REF_RETAIN
            p_ref = float(answer_probs(qr, tok, forget, **pkw).mean())
        else:
            ref_rows, p_ref, ref0 = sc.scores("unlearned", models["unlearned"], probe), unl_p, REF_UNLEARNED
        k_att, k_ref = mean_k(att_rows), mean_k(ref_rows)
        between = share_interval(att_rows, sc.scores("original", models["original"], probe), ref_rows, seed=cfg.seed)
        kept = unfit_layers(models["unlearned"], name)  # rows the format cannot hold: float16, as llama.cpp does
        out.append(AttackRow("quantize", name, sc.metric, len(forget), unl_k, k_att, orig_k, k_ref, ref0, plain,
                             extra=_prob_extra(p_att, orig_p, p_ref, unl_p)
                             | {"format": get_scheme(name).describe, "kept_float16": kept}, interval=between))
        log(f"  quantize ({name}): K {k_att}" + (f"; {len(kept)} weight(s) kept as float16" if kept else ""))
    return out


def _paraphrase_rows(models: dict[str, Any], tok: Any, forget: list[QARow], retain: list[QARow], sc: _Scorer,
                     cfg: AuditConfig, notes: list[str], log: Callable[[str], None]) -> list[AttackRow]:
    """Paraphrased question, few-shot and completion-style probes of the unlearned model."""
    direct = direct_probe(tok, forget)
    orig_k, unl_k = sc.k("original", models["original"], direct), sc.k("unlearned", models["unlearned"], direct)
    plain = sc.k("retain", models["retain"], direct) if "retain" in models else unl_k
    probes: list[Probe] = []
    for name in cfg.probes:
        if name == "paraphrased_question":
            p = paraphrase_probe(tok, forget)
            if p is None:
                notes.append("paraphrase probe skipped: no forget row has a paraphrased_question")
                continue
            probes.append(p)
        elif name == "few_shot":
            if not retain:
                notes.append("few-shot probe skipped: no retain rows")
                continue
            probes.append(few_shot_probe(tok, forget, few_shot_shots(retain, cfg.few_shot, cfg.seed)))
        else:
            probes.append(completion_probe(tok, forget))
    out = []
    orig_rows = sc.scores("original", models["original"], direct)
    for p in probes:
        att_rows = sc.scores("unlearned", models["unlearned"], p)
        if "retain" in models:
            ref_rows, ref0 = sc.scores("retain", models["retain"], p), REF_RETAIN
        else:
            ref_rows, ref0 = sc.scores("unlearned", models["unlearned"], direct), REF_UNLEARNED
        k_att, k_ref = mean_k(att_rows), mean_k(ref_rows)
        extra = {"original_under_probe": sc.k("original", models["original"], p)}
        if extra["original_under_probe"] is not None and k_ref is not None and extra["original_under_probe"] <= k_ref:
            notes.append(f"probe {p.name}: even the original model scores K {extra['original_under_probe']:.3f} "
                         f"under it (0% reference {k_ref:.3f}): on this model it extracts nothing, so it is no test")
        out.append(AttackRow("paraphrase", p.name, sc.metric, len(forget), unl_k, k_att, orig_k, k_ref, ref0, plain,
                             extra=extra, interval=share_interval(att_rows, orig_rows, ref_rows, seed=cfg.seed)))
        log(f"  paraphrase ({p.name}): K {k_att}")
    return out


def _mia_aucs(model: Any, tok: Any, forget: list[QARow], holdout: list[QARow], cfg: AuditConfig) -> dict[str, float]:
    """AUC of each reference-free MIA (forget = members, holdout = non-members); 1 = members exposed."""

    ts = token_scores(model, tok, forget + holdout, batch_size=cfg.batch_size, max_length=cfg.max_length)
    n = len(forget)
    return {a: mia_auc(s[:n], s[n:]) for a, s in attack_scores(ts).items() if a in MIA_ATTACKS}


def _mia_rows(models: dict[str, Any], tok: Any, forget: list[QARow], holdout: list[QARow], cfg: AuditConfig,
              notes: list[str]) -> list[AttackRow]:
    """One row per MIA: K = AUC (forget vs holdout); 0% = the retain model's AUC, else 0.5 (chance). A last row
    takes, per model, the strongest attack in either direction (max over attacks of max(AUC, 1 - AUC)): an
    unlearned model whose forget rows became far LESS likely than unseen ones (AUC near 0) exposes them too."""
    aucs = {k: _mia_aucs(m, tok, forget, holdout, cfg) for k, m in models.items()}
    out = []
    for a in MIA_ATTACKS:
        if a not in aucs["unlearned"]:
            continue
        ref = aucs["retain"][a] if "retain" in aucs else 0.5
        out.append(AttackRow("mia", a, "mia_auc", len(forget) + len(holdout), None, aucs["unlearned"][a],
                             aucs["original"][a], ref, REF_RETAIN if "retain" in aucs else "chance (AUC 0.5)",
                             extra={"auc": {k: v[a] for k, v in aucs.items()},
                                    "distinguishability": abs(2 * aucs["unlearned"][a] - 1)}))
    fold = {k: max(max(v, 1 - v) for v in a.values()) for k, a in aucs.items()}  # best attack, either direction
    out.append(AttackRow("mia", "any attack, either direction", "mia_auc_2sided", len(forget) + len(holdout), None,
                         fold["unlearned"], fold["original"], fold.get("retain", 0.5),
                         REF_RETAIN if "retain" in aucs else "chance (AUC 0.5)", extra={"auc_2sided": fold}))
    low = [r.variant for r in out if r.k_attacked is not None and r.k_attacked < 0.3]
    if low:
        notes.append(f"MIA AUC < 0.3 for {', '.join(low)}: the forget rows stand out as LESS likely than the "
                     "holdout rows, which also tells an attacker which rows were forgotten")
    return out


def run_audit(model: Any, original: Any, tokenizer: Any, forget: Sequence[QARow], *,
              retain_rows: Sequence[QARow] = (), holdout: Sequence[QARow] = (), retain_model: Any = None,
              cfg: AuditConfig | None = None, log: Callable[[str], None] = print) -> AuditResult:
    """Run cfg.attacks on the unlearned `model` (original and retain model share `tokenizer`) -> AuditResult."""
    t0 = time.perf_counter()
    cfg = cfg or AuditConfig()
    forget, retain_rows, holdout = list(forget), list(retain_rows), list(holdout)
    if cfg.max_examples:
        forget, holdout = forget[:cfg.max_examples], holdout[:cfg.max_examples]
    if not forget:
        raise ValueError("run_audit needs forget rows")
    models = {"original": original, "unlearned": model} | ({"retain": retain_model} if retain_model is not None else {})
    for m in models.values():
        m.eval()
    metric = k_metric(forget)
    sc = _Scorer(tokenizer, forget, metric, cfg)
    notes: list[str] = []
    direct = direct_probe(tokenizer, forget)
    baseline = {k: {"k": sc.k(k, m, direct), "prob": float(answer_probs(m, tokenizer, forget, batch_size=cfg.batch_size,
                                                                        max_length=cfg.max_length).mean())}
                for k, m in models.items()}
    log(f"audit: {len(forget)} forget rows, K = {metric}; without attack: "
        + ", ".join(f"{k} {v['k']:.3f}" if v["k"] is not None else f"{k} n/a" for k, v in baseline.items()))
    rows: list[AttackRow] = []
    for attack in track(list(cfg.attacks), f"audit: {len(cfg.attacks)} attacks"):
        t = time.perf_counter()
        if attack == "relearn":
            if len(forget) < 2 or not retain_rows:
                notes.append("relearn skipped: it needs >= 2 forget rows and retain rows for its control")
                continue
            rows += _relearn_rows(models, tokenizer, forget, retain_rows, sc, cfg, log)
        elif attack == "quantize":
            rows += _quantize_rows(models, tokenizer, forget, sc, cfg, log)
        elif attack == "paraphrase":
            rows += _paraphrase_rows(models, tokenizer, forget, retain_rows, sc, cfg, notes, log)
        elif attack == "mia":
            if not holdout:
                notes.append("mia skipped: no holdout rows (non-members) given")
                continue
            rows += _mia_rows(models, tokenizer, forget, holdout, cfg, notes)
        log(f"  {attack}: {time.perf_counter() - t:.1f} s")
    verdict = mark_headlines(rows)
    ref0 = REF_RETAIN if retain_model is not None else REF_UNLEARNED
    settings = {k: getattr(cfg, k) for k in ("attacks", "relearn_share", "relearn_steps", "relearn_lr",
                                              "relearn_batch_size", "quant_schemes", "group_size", "probes", "few_shot",
                                              "max_new_tokens", "max_length", "max_examples", "seed")}
    settings["samples"] = sc.samples
    return AuditResult(metric, ref0, rows, verdict, baseline, len(forget), time.perf_counter() - t0, notes, settings)
