"""`obliviate verify`: recompute an unlearned model's hashes and compare them with its receipt.json."""
from __future__ import annotations

import argparse

from obliviate.receipt import format_result, verify

HELP = "recompute an unlearned model's hashes and compare them with its receipt.json"
DESCRIPTION = ("Recompute the weight (and, with --data, the forget/retain row) hashes of a model directory and compare "
               "them with a receipt; exit 0 when all match, 1 when something differs, 2 on bad input.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("receipt", help="receipt.json written by `obliviate unlearn`")
    p.add_argument("model_dir", help="the model directory to check (its *.safetensors files)")
    p.add_argument("--data", help="data directory / hub id: re-encode the receipt's forget and retain splits too")


def run(args: argparse.Namespace) -> int:
    res = verify(args.receipt, args.model_dir, args.data)
    print(format_result(res))
    return 0 if res.ok else 1
