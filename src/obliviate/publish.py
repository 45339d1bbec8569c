"""`obliviate push`: an unlearned model's output directory onto the Hugging Face Hub, with its card and receipt.

What is sent is decided by the directory itself: the *.safetensors weights, every file its receipt.json records a
digest of (config, tokenizer, model card, metrics, ...) and the receipt, so that `obliviate verify receipt.json <dir>`
passes on a download of the repository. Nothing else (checkpoints, an audit folder, stray files) is sent.
The token is huggingface_hub's own: HF_TOKEN, or what `hf auth login` stored. No torch here.
"""
from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from obliviate import hub
from obliviate.errors import ObliviateError
from obliviate.receipt import CARD_NAME, RECEIPT_NAME, load_receipt, weight_files

CONFIGS = ("config.json", "adapter_config.json")  # a full model, or LoRA adapters saved alone (merge_on_save=false)


@dataclass(frozen=True)
class PushFile:
    """One file that a push sends: its name in the run directory (and in the repository) and its size in bytes."""

    name: str
    size: int


def check_repo_id(repo_id: str, key: str = "--repo-id") -> str:
    """`repo_id` when it is `owner/name`; a clear error otherwise."""
    if not hub.is_owner_name(repo_id):
        raise ObliviateError(f"{key} {repo_id!r} is not a repository id: it must be owner/name (letters, digits, "
                             "'-', '_', '.'), e.g. my-org/llama-forget10")
    return repo_id


def push_files(run_dir: str | Path) -> list[PushFile]:
    """The files a push of `run_dir` sends, sorted by name; a clear error naming what is missing when `run_dir` is
    not an unlearn output directory (model config, weights, model card, receipt) or lacks a file its receipt lists."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ObliviateError(f"run directory {d} not found (give the output_dir of `obliviate unlearn`)")
    missing = [name for name, ok in (
        ("config.json (or adapter_config.json)", any((d / c).is_file() for c in CONFIGS)),
        ("*.safetensors weights", bool(weight_files(d))),
        (f"{CARD_NAME} model card", (d / CARD_NAME).is_file()),
        (RECEIPT_NAME, (d / RECEIPT_NAME).is_file())) if not ok]
    if missing:
        raise ObliviateError(f"{d} is not an unlearned run directory: it has no {', no '.join(missing)} "
                             "(`obliviate unlearn` writes them all into its output_dir)")
    recorded = sorted((load_receipt(d / RECEIPT_NAME).get("files") or {}))
    gone = [n for n in recorded if not (d / n).is_file()]
    if gone:
        raise ObliviateError(f"{d}: file(s) recorded in its receipt are missing: {', '.join(gone)}; "
                             f"check the directory with `obliviate verify {d / RECEIPT_NAME} {d}`")
    names = sorted({p.name for p in weight_files(d)} | set(recorded) | {CARD_NAME, RECEIPT_NAME})
    return [PushFile(n, (d / n).stat().st_size) for n in names]


def allow_patterns(files: list[PushFile]) -> list[str]:
    """The files as `upload_folder` allow-patterns: each name exactly (glob characters escaped)."""
    return [glob.escape(f.name) for f in files]


def format_plan(files: list[PushFile], repo_id: str, private: bool = False, revision: str | None = None) -> str:
    """The files a push sends (size in bytes, name) and where to, as printed by `obliviate push`."""
    total = sum(f.size for f in files)
    width = max(len(f"{total:,}"), len("bytes"))
    where = f"{repo_id} (branch {revision or 'main'}; created {'private' if private else 'public'} when missing)"
    lines = [f"{len(files)} files, {total:,} bytes, to hub model repository {where}:", f"{'bytes':>{width}}  file"]
    lines += [f"{f.size:>{width},}  {f.name}" for f in files]
    return "\n".join(lines)


def push(run_dir: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
         message: str | None = None) -> str:
    """Upload `push_files(run_dir)` to model repository `repo_id` (created when missing, private if asked; the branch
    `revision` created when missing) in one commit; returns the commit's URL."""
    check_repo_id(repo_id)
    files = push_files(run_dir)
    hub.check_can_push()
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        message = message or f"obliviate push: {len(files)} files from {Path(run_dir).name}"
        info = api.upload_folder(repo_id=repo_id, folder_path=str(run_dir), repo_type="model", revision=revision,
                                 allow_patterns=allow_patterns(files), commit_message=message)
    except Exception as exc:  # HTTP, auth and connection errors of every transport huggingface_hub uses
        raise ObliviateError(f"the push to {repo_id} failed: {type(exc).__name__}: {exc}") from None
    return str(getattr(info, "commit_url", None) or f"{hub.DEFAULT_ENDPOINT}/{repo_id}")
