"""The audit's settings: one frozen dataclass, usable as `obliviate audit` flags and as an `audit:` run-config section.

No torch here: the CLI and the config loader read it without loading models.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from obliviate.config.fields import require, setting

ATTACKS: tuple[str, ...] = ("relearn", "quantize", "paraphrase", "mia")
PROBES: tuple[str, ...] = ("paraphrased_question", "few_shot", "completion")
# the names of obliviate.audit.quantize.SCHEMES (no torch here; tests/audit/test_quantize.py checks they agree)
QUANT_SCHEMES: tuple[str, ...] = ("rtn_int8", "rtn_int4", "nf4", "fp4", "gguf_q8_0", "gguf_q4_0")
# gguf_q8_0 is left out by default: its blocks of 32 never get a coarser step than rtn_int8's whole row
DEFAULT_QUANT: tuple[str, ...] = ("rtn_int8", "rtn_int4", "nf4", "fp4", "gguf_q4_0")


@dataclass(frozen=True)
class AuditConfig:
    enabled: bool = setting(False, "run config only: audit the saved model after unlearning (original = model.path)")
    model: str | None = setting(None, "the unlearned model (directory or hub id); in a run config: the run's output_dir")
    original: str | None = setting(None, "the model before unlearning: the 100% reference; in a run config: model.path")
    retain_model: str | None = setting(None, "a model never trained on the forget set: the 0% reference, attacked the same "
                                        "way (without it: the unlearned model without attack)")
    data: str | None = setting(None, "data directory / file / hub id (in a run config: eval.source or data.source)")
    forget_split: str | None = setting(None, "forget split (null: forget10, in a run config data.forget_split); its "
                                        "_perturbed version (paraphrased questions) is used when the source has one")
    retain_split: str | None = setting(None, "retain rows (few-shot examples, relearning control); default retain{100-N}")
    holdout_split: str | None = setting(None, "non-members for membership inference; default holdout{N}")
    attacks: list = setting(list(ATTACKS), f"attacks to run, any of {', '.join(ATTACKS)}")
    relearn_share: float = setting(0.2, "share of the forget rows the relearning attack trains on (seeded); recovery is "
                                   "measured on the others")
    relearn_steps: int = setting(10, "optimizer steps of each relearning run (the retain-only control gets as many)")
    relearn_lr: float = setting(1e-4, "learning rate of the relearning runs (AdamW, constant)")
    relearn_batch_size: int = setting(4, "rows per relearning step")
    quant_schemes: list = setting(list(DEFAULT_QUANT), "weight formats of the quantisation attack, one verdict row "
                                  f"each, any of {', '.join(QUANT_SCHEMES)} (docs/METRICS.md §10)")
    bits: list | None = setting(None, "retired: use quant_schemes (bits 8 and 4 were rtn_int8 and rtn_int4)")
    group_size: int = setting(128, "input columns per rtn_int4 quantisation group")
    probes: list = setting(list(PROBES), f"indirect prompts of the paraphrase attack, any of {', '.join(PROBES)}")
    few_shot: int = setting(3, "retain QA pairs placed before the forget question in the few-shot probe")
    max_new_tokens: int = setting(48, "greedy tokens per answer")
    batch_size: int = setting(32, "rows per forward / generation batch")
    max_length: int = setting(256, "max tokens of a scored or prompted sequence")
    max_examples: int | None = setting(None, "first N forget (and holdout) rows only")
    seed: int = setting(0, "seed of the relearning split, the few-shot examples and the relearning runs")
    output: str | None = setting(None, "directory for audit.json, report.md, report.html (none: print only)")
    overwrite: bool = setting(False, "replace an existing output directory")

    def __post_init__(self) -> None:
        bad = [a for a in self.attacks if a not in ATTACKS]
        require(not bad and bool(self.attacks), "audit.attacks", self.attacks, f"a non-empty list of {ATTACKS}")
        require(0 < self.relearn_share < 1, "audit.relearn_share", self.relearn_share, "in (0, 1)")
        require(self.relearn_steps >= 1, "audit.relearn_steps", self.relearn_steps, ">= 1")
        require(self.relearn_lr > 0, "audit.relearn_lr", self.relearn_lr, "> 0")
        require(self.relearn_batch_size >= 1, "audit.relearn_batch_size", self.relearn_batch_size, ">= 1")
        require(self.bits is None, "audit.bits", self.bits, "null (retired: set audit.quant_schemes instead; "
                "bits=[8, 4] is quant_schemes=[rtn_int8, rtn_int4])")
        bad = [s for s in self.quant_schemes if s not in QUANT_SCHEMES]
        require(not bad and bool(self.quant_schemes), "audit.quant_schemes", self.quant_schemes,
                f"a non-empty list of {QUANT_SCHEMES}")
        require(self.group_size >= 1, "audit.group_size", self.group_size, ">= 1")
        require(all(p in PROBES for p in self.probes), "audit.probes", self.probes, f"a list of {PROBES}")
        require(self.few_shot >= 1, "audit.few_shot", self.few_shot, ">= 1")
        require(self.max_new_tokens >= 1, "audit.max_new_tokens", self.max_new_tokens, ">= 1")
        require(self.batch_size >= 1, "audit.batch_size", self.batch_size, ">= 1")
        require(self.max_length >= 16, "audit.max_length", self.max_length, ">= 16")
        require(self.max_examples is None or self.max_examples >= 2, "audit.max_examples", self.max_examples,
                 ">= 2 or null")

    def split_names(self) -> tuple[str, str | None, str | None]:
        """(forget, retain, holdout) split names; retain{100-N} / holdout{N} follow a forget{N} split by default."""
        forget = (self.forget_split or "forget10").removesuffix("_perturbed")
        m = re.fullmatch(r"forget(\d+)", forget)
        retain = self.retain_split or (f"retain{100 - int(m[1]):02d}" if m else None)
        holdout = self.holdout_split or (f"holdout{m[1]}" if m else None)
        return forget, retain, holdout
