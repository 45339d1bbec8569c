"""`obliviate push`: upload an unlearned model, its model card and its receipt to the Hugging Face Hub."""
from __future__ import annotations

import argparse

from obliviate.publish import check_repo_id, format_plan, push, push_files

HELP = "upload an unlearned model with its model card and receipt to the Hugging Face Hub"
DESCRIPTION = ("Upload an `obliviate unlearn` output directory to a Hub model repository (created when missing): the "
               "weights, every file its receipt records (config, tokenizer, README.md model card, metrics) and "
               "receipt.json, in one commit. The token is HF_TOKEN or the one `hf auth login` stored. --dry-run lists "
               "the files and sizes and contacts nothing.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="the output_dir of `obliviate unlearn`")
    p.add_argument("--repo-id", required=True, help="owner/name of the model repository on the Hub")
    p.add_argument("--private", action="store_true", help="create the repository private (an existing one keeps its "
                                                          "visibility)")
    p.add_argument("--revision", help="branch to push to, created when missing (default: main)")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be sent, with their sizes; "
                                                          "contact nothing")


def run(args: argparse.Namespace) -> int:
    check_repo_id(args.repo_id)
    files = push_files(args.run_dir)
    print(format_plan(files, args.repo_id, args.private, args.revision))
    if args.dry_run:
        print("dry run: nothing was sent")
        return 0
    url = push(args.run_dir, args.repo_id, private=args.private, revision=args.revision)
    print(f"pushed to {args.repo_id}: {url}")
    return 0
