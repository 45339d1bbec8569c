"""Published tables that `obliviate reproduce` runs again: which presets make each row, which metrics it reports,
and the numbers the source published, with the source named. Data only: no torch, no imports beyond the
standard library.

Room `published` (floor 1). A number here is a transcription of a source's table, never ours; a table whose
source's numbers are not transcribed has an empty `published` and says so in its `note`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# locuslab/open-unlearning docs/results.md (commit 8f9872c), "TOFU unlearning on the Llama-3.2-1B-Instruct
# architecture": (forget_quality, model_utility, forget_truth_ratio) per method and forget split, as printed there.
OPEN_UNLEARNING_TOFU_1B: dict[str, dict[str, tuple[str, str, str]]] = {
    "finetuned": {"01": ("0.01", "0.60", "0.47"), "05": ("2.96e-13", "0.6", "0.47"), "10": ("8.08e-22", "0.6", "0.48")},
    "retain": {"01": ("1.0", "0.60", "0.65"), "05": ("1.0", "0.6", "0.63"), "10": ("1.0", "0.59", "0.63")},
    "grad_ascent": {"01": ("0.27", "0.33", "0.59"), "05": ("1.94e-119", "0", "2.52e-23"),
                    "10": ("1.06e-239", "0", "2.25e-18")},
    "graddiff": {"01": ("0.77", "0.43", "0.57"), "05": ("1.94e-119", "0.53", "3.87e-34"),
                 "10": ("1.06e-239", "0.49", "3.53e-27")},
    "idk_dpo": {"01": ("0.01", "0.51", "0.60"), "05": ("1.12e-05", "0.07", "0.62"), "10": ("4.64e-12", "0.23", "0.6")},
    "npo": {"01": ("0.92", "0.56", "0.66"), "05": ("0.14", "0.45", "0.7"), "10": ("0.02", "0.46", "0.7")},
    "simnpo": {"01": ("0.58", "0.46", "0.55"), "05": ("5.01e-100", "0.58", "4.19e-03"),
               "10": ("2.47e-203", "0.54", "1.07e-05")},
    "rmu": {"01": ("6.76e-03", "0.60", "0.47"), "05": ("2.89e-11", "0.6", "0.47"), "10": ("0.32", "0.59", "0.64")},
}
SPLITS = ("01", "05", "10")
TOFU_METRICS = ("forget_quality", "model_utility", "forget_truth_ratio")


@dataclass(frozen=True)
class Table:
    """A published table: rows are preset stems in `family` (configs/gpu/<family>/<row>.yaml, CPU twins in
    configs/twins/<family>/<row>.yaml; `presets` names another folder of GPU presets, `twins` None when the rows
    have none and `twinless` says why), columns obliviate's evaluation keys, `published` the source's numbers.
    `evals`: evaluations run on each row's model after it trains (`obliviate eval` key=value settings each), for
    rows whose own config evaluates nothing the table reports."""

    name: str
    title: str
    family: str
    rows: tuple[str, ...]
    metrics: tuple[str, ...]
    source: str
    published: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    note: str = ""
    presets: str = ""
    twins: str | None = ""
    twinless: str = ""
    evals: tuple[tuple[str, ...], ...] = ()

    def folder(self, twins: bool) -> str:
        """Where the rows' presets are: configs/gpu/<family> (or `presets`), configs/twins/<family> (or `twins`)."""
        if twins:
            return self.twins or f"configs/twins/{self.family}"
        return self.presets or f"configs/gpu/{self.family}"


def _open_unlearning_rows() -> dict[str, dict[str, float]]:
    return {f"{method}_forget{split}": dict(zip(TOFU_METRICS, map(float, values[split])))
            for method, values in OPEN_UNLEARNING_TOFU_1B.items() if method not in ("finetuned", "retain")
            for split in SPLITS}


# SAGO (Xiao et al., "Modeling LLM Unlearning as an Asymmetric Two-Task Learning Problem", ACL 2026, arXiv
# 2604.14808), its headline comparison on WMDP-Bio with Zephyr-7B-beta and SimNPO+GD as the paper's summary states
# it: (WMDP-Bio accuracy, MMLU accuracy) in percent per gradient rule; the target model's MMLU is 59.8.
SAGO_WMDP_BIO_SIMNPO: dict[str, tuple[str, str]] = {"sum": ("26.1", "26.7"), "pcgrad": ("28.7", "56.4"),
                                                   "sago": ("28.2", "57.4")}
WMDP_METRICS = ("lm_eval_wmdp_bio_accuracy", "lm_eval_mmlu_accuracy")
WMDP_EVALS = (("benchmark=mcq", "mcq.lm_eval_tasks=[wmdp_bio]", "mcq.lm_eval_num_fewshot=0"),
              ("benchmark=mcq", "mcq.lm_eval_tasks=[mmlu]", "mcq.lm_eval_num_fewshot=5"))


def _sago_rows() -> dict[str, dict[str, float]]:
    return {f"simnpo_{rule}_bio": dict(zip(WMDP_METRICS, (float(a) / 100 for a in values)))
            for rule, values in SAGO_WMDP_BIO_SIMNPO.items()}


TABLES: dict[str, Table] = {t.name: t for t in (
    Table("tofu-llama32-1b", "TOFU on Llama-3.2-1B-Instruct, open-unlearning's baselines", "tofu_llama32_1b",
          tuple(_open_unlearning_rows()), TOFU_METRICS,
          "locuslab/open-unlearning docs/results.md (commit 8f9872c), its TOFU table for Llama-3.2-1B-Instruct",
          _open_unlearning_rows()),
    Table("asu-tofu-llama2-7b", "TOFU on Llama-2-7B, ASU as its authors' scripts run it", "asu_tofu_llama2_7b",
          tuple(f"{m}_forget{s}" for m in ("asu_gd", "asu_kl", "asu_kl_released") for s in SPLITS),
          TOFU_METRICS + ("forget_rougeL_recall",),
          "the ASU paper (arXiv 2603.01285) and Salehzz/ASU-unlearning",
          note="The paper reports closer-look's FE/MU for these runs; its figures are not transcribed here, so this "
               "table has our numbers only"),
    Table("sago-wmdp-bio", "WMDP-Bio on Zephyr-7B-beta, SAGO's rules as its authors' configs run them", "wmdp",
          tuple(f"{m}_{r}_bio" for m in ("simnpo", "npo") for r in ("sum", "pcgrad", "sago"))
          + tuple(f"graddiff_{r}_bio" for r in ("sum", "pcgrad", "pcgrad_global", "sago")),
          WMDP_METRICS, "the SAGO paper (arXiv 2604.14808), its headline SimNPO+GD figures (target MMLU 0.598)",
          _sago_rows(),
          note="Each row is scored as SAGO's README scores it: lm-evaluation-harness wmdp_bio zero-shot and mmlu "
               "5-shot (pip install lm-eval); the paper's summary gives SimNPO+GD's three rules only, so the NPO and "
               "GradDiff rows hold our numbers only",
          presets="configs/wmdp", twins=None,
          twinless="WMDP's bio forget corpus is gated and its questions come from the hub, so the WMDP presets have "
                   "no CPU twins; the suite runs each WMDP recipe for a few steps on a made-up corpus instead "
                   "(tests/config/test_authors_presets.py)",
          evals=WMDP_EVALS),
)}
