"""Raw-text corpora for MUSE-style unlearning (Shi et al. 2024): loading, validation, training windows.

Sources (`load_texts(source, split)`):
- a `.txt` file is ONE document (a book, an article); blank lines inside it are kept, not split on;
- a `.jsonl` file holds one JSON object with a string "text" field per line;
- a `.json` file holds a list of such objects or of plain strings (or {"data": [...]});
- a directory with a split: `<dir>/<split>.jsonl|.json|.txt`, or `<dir>/<split>/` holding `*.txt`
  files (one document each); a split may name a sub-folder, "raw/forget" -> `<dir>/raw/forget.jsonl`,
  which mirrors the MUSE hub configs (see obliviate.eval.muse);
- a directory without a split: every `*.txt` in it, sorted by name, one document each;
- a split written with its extension ("raw/forget.txt") names that one file, even when a .jsonl or
  .json of the same name exists (without an extension .jsonl wins, then .json, then .txt);
- a hub id "owner/name" (e.g. muse-bench/MUSE-News) with split "config/split" ("raw/forget") or
  `config=` and split, through datasets.load_dataset; rows need a string "text" field.
A missing / non-string "text" and an empty corpus are DataErrors naming file:line (JSONL), file item i
(JSON) or hub row i. Empty or whitespace-only documents are DataErrors too, unless the caller passes a
`skipped` list: then they are left out and their locations appended to it (MUSE-News raw/forget.json
holds one empty document, item 821), so the caller can report how many were skipped.

Chunking (`chunk_texts`): each document becomes [BOS] + its tokens (no EOS), cut into consecutive
windows of `max_length` tokens (stride = max_length, no overlap). Every token is a label (no prompt
mask). A document's last, shorter window is kept when it holds at least `min_tokens` tokens, and a
document that fits in one window is always kept (if it has >= 2 tokens, i.e. one next-token target),
so short documents are never lost; dropped tails are at most min_tokens - 1 tokens per document.
That is `data.windows: document`. `data.windows: stream` (`stream_windows`) cuts them as open-unlearning's
PretrainingDataset does (src/data/pretraining.py, which SAGO's WMDP and RWKU runs use): every document + "\n\n"
tokenised without special tokens, all of them concatenated into one stream, cut into floor(L / max_length)
windows of max_length tokens (the stream's tail is dropped), each window decoded to text and tokenised again
with BOS in front (preprocess_pretraining_instance), so a window holds up to max_length + 1 ids and its first
label is the BOS's successor. MUSE's own trainer (its .txt corpora) gives every window a BOS too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from obliviate.data.rows import read_records
from obliviate.data.tokenize import Encoded
from obliviate.errors import DataError
from obliviate.hub import require_hub

TEXT_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".txt")
DEFAULT_MIN_TOKENS = 32


def text_from_record(rec: Any, where: str) -> str:
    """The document of one raw record: a non-empty string, or an object's string "text" field."""
    if isinstance(rec, dict):
        if "text" not in rec or rec["text"] is None:
            raise DataError(f"{where}: missing field 'text' (every raw-text row needs a 'text' string)")
        rec = rec["text"]
    elif not isinstance(rec, str):
        raise DataError(f"{where}: expected an object with a 'text' field or a string, got {type(rec).__name__}")
    if not isinstance(rec, str):
        raise DataError(f"{where}: field 'text' must be a string, got {type(rec).__name__}")
    if not rec.strip():
        raise DataError(f"{where}: the document is empty")
    return rec


def is_blank_document(rec: Any) -> bool:
    """True for a whitespace-only string or an object whose "text" is one (the empty documents skipped on request)."""
    text = rec.get("text") if isinstance(rec, dict) else rec
    return isinstance(text, str) and not text.strip()


def texts_from_records(records: Sequence[tuple[str, Any]], skipped: list[str] | None = None) -> list[str]:
    """Documents of (where, record) pairs; with a `skipped` list, blank documents are left out and their
    locations appended to it, else they are DataErrors."""
    out = []
    for where, rec in records:
        if skipped is not None and is_blank_document(rec):
            skipped.append(where)
            continue
        out.append(text_from_record(rec, where))
    return out


def _txt_record(path: Path) -> list[tuple[str, Any]]:
    """The one (where, document) record of a .txt file."""
    try:
        return [(str(path), path.read_text(encoding="utf-8"))]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None


def read_text_file(path: Path, skipped: list[str] | None = None) -> list[str]:
    """Documents of one .txt (the whole file), .jsonl or .json file; an empty file is an error.
    `skipped`: see texts_from_records."""
    if path.suffix not in TEXT_SUFFIXES:
        raise DataError(f"{path}: unsupported raw-text file type {path.suffix!r}; "
                        f"use one of {', '.join(TEXT_SUFFIXES)}")
    records = _txt_record(path) if path.suffix == ".txt" else read_records(path)
    docs = texts_from_records(records, skipped)
    if not docs:
        blank = sum(is_blank_document(r) for _, r in records)
        raise DataError(f"{path}: the corpus is empty; it needs at least one document"
                        + (f" ({blank} empty document(s) skipped)" if blank else ""))
    return docs


def _txt_dir(directory: Path, skipped: list[str] | None = None) -> list[str]:
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix == ".txt")
    if not files:
        raise DataError(f"{directory}: no .txt documents in this directory (name a split to read "
                        f"<split>.jsonl / <split>.json / <split>.txt instead)")
    out = texts_from_records([rec for f in files for rec in _txt_record(f)], skipped)
    if not out:
        raise DataError(f"{directory}: the corpus is empty; every .txt document in it is empty")
    return out


def split_source(directory: Path, split: str) -> Path:
    """The file (or folder of .txt files) of `split` in `directory`; `split` may hold '/' (raw/forget) and may
    end in its extension (raw/forget.txt) to pick that file over a .jsonl / .json of the same name."""
    base = directory / split
    if base.suffix in TEXT_SUFFIXES and base.is_file():
        return base
    for ext in TEXT_SUFFIXES:
        cand = base.with_name(base.name + ext)
        if cand.is_file():
            return cand
    if base.is_dir():
        return base
    parent = base.parent
    have = sorted({p.stem for p in parent.iterdir() if p.suffix in TEXT_SUFFIXES}) if parent.is_dir() else []
    raise DataError(f"no split {split!r} in {directory} (looked for {split}.jsonl / .json / .txt and a "
                    f"{split}/ folder of .txt files); splits there: {', '.join(have) or 'none'}")


def load_hub_texts(repo_id: str, config: str | None, split: str, skipped: list[str] | None = None) -> list[str]:
    """Documents of `split` of hub dataset `repo_id` (config e.g. "raw") via datasets.load_dataset."""

    require_hub(f"data source {repo_id!r}")  # seconds, not minutes of retries, when offline
    import datasets  # heavy import, only on this path

    try:
        ds = datasets.load_dataset(repo_id, config, split=split)
    except Exception as exc:  # network, unknown config or split, ... all become one clear message
        raise DataError(f"could not load {repo_id!r} config {config!r} split {split!r} from the hub: {exc}. "
                        "Offline? Point the source at a local directory in the same layout instead.") from None
    name = f"{repo_id}/{config}/{split}" if config else f"{repo_id}/{split}"
    docs = texts_from_records([(f"{name} row {i}", dict(rec)) for i, rec in enumerate(ds)], skipped)
    if not docs:
        raise DataError(f"{name}: the corpus is empty")
    return docs


def is_hub_id(source: str) -> bool:
    """True for "owner/name" that is not a local path (a hub dataset id)."""
    return source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).exists()


def load_texts(source: str | Path, split: str | None = None, *, config: str | None = None,
               skipped: list[str] | None = None) -> list[str]:
    """Raw documents from a file, a directory (+ split), or a hub id + "config/split" (module docstring).

    skipped: when a list, empty documents are left out and their locations appended (else a DataError).
    """
    path = Path(source)
    if path.is_file():
        return read_text_file(path, skipped)
    if path.is_dir():
        if not split:
            return _txt_dir(path, skipped)
        target = split_source(path / config if config else path, split)
        return _txt_dir(target, skipped) if target.is_dir() else read_text_file(target, skipped)
    if is_hub_id(str(source)):
        if not split:
            raise DataError(f"hub dataset {source!r} needs a split, e.g. 'raw/forget' (config/split)")
        if config is None and "/" in split:
            config, split = split.split("/", 1)
        return load_hub_texts(str(source), config, split, skipped)
    raise DataError(f"text source {str(source)!r}: no such file or folder (from {Path.cwd()}), and not a hub "
                    "dataset id (owner/name with a 'config/split'); create it first (a preset's header says how) "
                    "or point data.source at your corpus")


def document_ids(tokenizer: Any, text: str) -> list[int]:
    """[BOS] + token ids of one document (no EOS); BOS only when the tokenizer has one."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + tokenizer(text, add_special_tokens=False)["input_ids"]


def window_ids(ids: Sequence[int], max_length: int, min_tokens: int) -> list[list[int]]:
    """Consecutive non-overlapping windows of `max_length` ids; a short tail is kept if >= min_tokens
    ids or if it is the only window (and holds >= 2 ids). [L] -> list of [<= max_length]."""
    windows = [list(ids[i:i + max_length]) for i in range(0, len(ids), max_length)]
    if len(windows) > 1 and len(windows[-1]) < min_tokens:
        windows.pop()
    return [w for w in windows if len(w) >= 2]


WINDOWS = ("document", "stream")


def stream_windows(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[Encoded]:
    """open-unlearning's PretrainingDataset windows (module docstring): documents + "\n\n" as one token stream,
    floor(L / max_length) windows, each decoded and re-encoded as [BOS] + ids (cut to max_length + 1 ids);
    every token a label. [documents] -> [Encoded], in stream order."""
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")
    if not texts:
        raise DataError("no documents to chunk: the corpus is empty")
    stream = [i for ids in tokenizer([t + "\n\n" for t in texts], add_special_tokens=False)["input_ids"] for i in ids]
    if len(stream) < max_length:
        raise DataError(f"the corpus holds {len(stream)} tokens, fewer than one window of data.max_length="
                        f"{max_length}: lower data.max_length or use data.windows=document (per-document windows)")
    out = []
    for start in range(0, len(stream) // max_length * max_length, max_length):
        text = tokenizer.decode(stream[start:start + max_length], skip_special_tokens=True)
        ids = document_ids(tokenizer, text)[: max_length + 1]
        out.append(Encoded(ids, list(ids), True))
    return out


def chunk_texts(tokenizer: Any, texts: Sequence[str], max_length: int,
                min_tokens: int | None = None) -> list[Encoded]:
    """Training windows of raw documents, every token a label (MUSE raw-text training, Shi et al. 2024).

    Returns Encoded(input_ids [<= max_length], labels == input_ids, truncated = the document needed
    more than one window), in document order, ready for tokenize.collate. min_tokens defaults to
    min(DEFAULT_MIN_TOKENS, max_length).
    """
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, got {max_length}")
    min_tokens = min(DEFAULT_MIN_TOKENS, max_length) if min_tokens is None else min_tokens
    if not 2 <= min_tokens <= max_length:
        raise ValueError(f"min_tokens must lie in [2, max_length={max_length}] (2 = one next-token target), "
                         f"got {min_tokens}")
    if not texts:
        raise DataError("no documents to chunk: the corpus is empty")
    out: list[Encoded] = []
    for text in texts:
        ids = document_ids(tokenizer, text)
        split = len(ids) > max_length
        out += [Encoded(w, list(w), split) for w in window_ids(ids, max_length, min_tokens)]
    if not out:
        raise DataError("chunking produced no training windows: every document tokenised to fewer than 2 tokens")
    return out
