"""`obliviate audit`: flags -> AuditConfig -> audit_from_config. No torch at import (the CLI's --help stays light)."""
from __future__ import annotations

import argparse
from typing import Any

from obliviate.audit.run import audit_from_config
from obliviate.config import apply_overrides, build, describe, read_yaml
from obliviate.config.audit import ATTACKS, AuditConfig

HELP = "attack an unlearned model (relearning, quantisation, paraphrases, MIA) and say how much knowledge came back"
FLAGS = (("--model", "model", "the unlearned model directory"),
         ("--original", "original", "the model before unlearning (the 100%% reference)"),
         ("--data", "data", "data directory / file / hub id holding the forget split (e.g. obliviate-demo/world)"),
         ("--retain-model", "retain_model", "a model never trained on the forget set (the 0%% reference)"),
         ("--output", "output", "directory for audit.json, report.md and report.html"),
         ("--forget-split", "forget_split", "forget split (default forget10; its _perturbed file when present)"),
         ("--retain-split", "retain_split", "retain split (default retain{100-N})"),
         ("--holdout-split", "holdout_split", "holdout split, the MIA non-members (default holdout{N})"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The audit's flags, its --config file and key=value settings."""
    for flag, _, text in FLAGS:
        ap.add_argument(flag, help=text)
    ap.add_argument("--attacks", help=f"comma-separated subset of {','.join(ATTACKS)} (default: all)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output directory")
    ap.add_argument("--config", help="YAML with audit keys (top level or under 'audit:')")
    ap.add_argument("overrides", nargs="*", help="key=value settings, e.g. relearn_steps=20 quant_schemes=[nf4,gguf_q4_0]")
    ap.add_argument("--show-config", action="store_true", help="print the resolved settings and exit")
    ap.add_argument("--help-config", action="store_true", help="list every setting with its default and meaning")


def audit_config(args: argparse.Namespace) -> AuditConfig:
    """The AuditConfig of parsed `obliviate audit` arguments: YAML, then flags, then key=value overrides."""

    raw: dict[str, Any] = {}
    if args.config:
        raw = read_yaml(args.config)
        raw = raw.get("audit", raw) if isinstance(raw.get("audit"), dict) else raw
    for _, key, _ in FLAGS:
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    if args.attacks:
        raw["attacks"] = [a.strip() for a in args.attacks.split(",") if a.strip()]
    if args.overwrite:
        raw["overwrite"] = True
    return build(AuditConfig, apply_overrides(raw, args.overrides))


def run(args: argparse.Namespace) -> int:
    """`obliviate audit`: print the verdict table, write the reports; 0 on success."""
    if args.help_config:
        for key, default, text in describe(AuditConfig):
            print(f"{key:<22} {default!r:<34} {text}")
        return 0
    cfg = audit_config(args)
    if args.show_config:
        import dataclasses

        import yaml

        print(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        return 0
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    audit_from_config(cfg)
    return 0
