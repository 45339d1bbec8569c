"""`obliviate verify`: a receipt re-checked against the model directory (and the data): each difference named."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from obliviate.data.splits import load_data
from obliviate.errors import ObliviateError
from obliviate.files import file_sha256
from obliviate.receipt.build import load_receipt
from obliviate.receipt.digests import (
    dir_hashes,
    encoded_digests,
    rows_digest,
    tokenizer_info,
    weight_files,
    weights_digest,
)


@dataclass(frozen=True)
class Difference:
    """One thing that does not match the receipt."""

    kind: str  # tensor | file | tokenizer | data
    name: str  # tensor name, file name, or "forget"/"retain"
    detail: str


@dataclass
class VerifyResult:
    """What `verify` found: the differences (empty: everything matches) and whether the overall digest matches."""

    receipt: str
    model_dir: str
    overall_match: bool
    n_tensors: int
    differences: list[Difference] = field(default_factory=list)
    data_checked: bool = False

    @property
    def ok(self) -> bool:
        return self.overall_match and not self.differences


def _compare_tensors(recorded: Mapping[str, Any], found: Mapping[str, Any]) -> list[Difference]:
    """Per tensor: differing digest, dtype or shape; missing from the directory; extra in it."""
    out = []
    for name in sorted(set(recorded) | set(found)):
        r, f = recorded.get(name), found.get(name)
        if f is None:
            out.append(Difference("tensor", name, f"missing (expected in {r.get('file', '?')})"))
        elif r is None:
            out.append(Difference("tensor", name, f"extra (in {f['file']}, not in the receipt)"))
        elif (r["dtype"], list(r["shape"])) != (f["dtype"], f["shape"]):
            out.append(Difference("tensor", name, f"{f['dtype']}{f['shape']} in {f['file']}, receipt says "
                                                  f"{r['dtype']}{list(r['shape'])}"))
        elif r["sha256"] != f["sha256"]:
            out.append(Difference("tensor", name, f"sha256 {f['sha256'][:16]}… in {f['file']}, receipt says "
                                                  f"{r['sha256'][:16]}…"))
    return out


def _compare_files(recorded: Mapping[str, str], model_dir: Path) -> list[Difference]:
    """Recorded non-weight files: missing or changed (files added later are not differences)."""
    out = []
    for name, digest in sorted(recorded.items()):
        path = model_dir / name
        if not path.is_file():
            out.append(Difference("file", name, "missing"))
        elif file_sha256(path) != digest:
            out.append(Difference("file", name, "content differs from the receipt"))
    return out


def _row_text(row: Any) -> str:
    """A row's question (QA) or the start of a document (text), on one line."""
    text = getattr(row, "question", row if isinstance(row, str) else str(row))
    text = " ".join(str(text).split())
    return text if len(text) <= 100 else text[:97] + "..."


def _compare_side(side: str, record: Mapping[str, Any], rows: Sequence[Any], digests: list[str]) -> list[Difference]:
    """The first differing row of one side (index, question) and how many differ; a changed row count."""
    want = list(record.get("rows") or [])
    out = []
    bad = [i for i, (a, b) in enumerate(zip(want, digests)) if a != b]
    if bad:
        i = bad[0]
        where = f" (question: {_row_text(rows[i])!r})" if len(rows) == len(digests) else ""
        out.append(Difference("data", side, f"row {i} differs{where}; {len(bad)} of {min(len(want), len(digests))} "
                                            "rows differ"))
    if len(want) != len(digests):
        out.append(Difference("data", side, f"{len(digests)} encoded rows, receipt has {len(want)}"
                                            + (f"; first extra/missing at row {min(len(want), len(digests))}")))
    if not bad and len(want) == len(digests) and record.get("sha256") != rows_digest(digests):
        out.append(Difference("data", side, "overall rows digest differs from the receipt"))
    return out


def _verify_data(receipt: Mapping[str, Any], model_dir: Path, source: str) -> list[Difference]:
    """Re-encode the receipt's forget and retain splits from `source` with the model's tokenizer and compare."""
    from obliviate.modeling.load import load_tokenizer

    try:
        data, cfg_data = receipt["data"], receipt["config"]["data"]
        settings = data["tokenization"]
    except (KeyError, TypeError):
        raise ObliviateError("the receipt has no data section (data / config.data); cannot check --data") from None
    tok = load_tokenizer(str(model_dir))
    now = tokenizer_info(tok, settings["max_length"])
    out = [Difference("tokenizer", key, f"{now[key]!r}, receipt says {settings.get(key)!r}")
           for key in ("vocab_sha256", "vocab_size", "chat_template", "chat_template_sha256", "chat_system",
                       "chat_template_args", "prompt_template") if now[key] != settings.get(key)]
    for side in ("forget", "retain"):
        split = data[side]["split"] if side in data else cfg_data[f"{side}_split"]
        rows = load_data(source, cfg_data.get("format", "qa"), [split])
        out += _compare_side(side, data[side], rows, encoded_digests(tok, rows, settings["max_length"],
                                                                     cfg_data.get("windows", "document")))
    return out


def verify(receipt_path: str | Path, model_dir: str | Path, data: str | None = None) -> VerifyResult:
    """Recompute the final-weight (and, with `data`, the rows') digests of a model directory against a receipt."""
    receipt = load_receipt(receipt_path)
    directory = Path(model_dir)
    if not directory.is_dir():
        raise ObliviateError(f"model directory {directory} not found")
    if not weight_files(directory):
        raise ObliviateError(f"{directory} is not a model directory: it has no *.safetensors file")
    final = receipt["weights"]["final"]
    found = dir_hashes(directory)
    res = VerifyResult(str(receipt_path), str(directory), weights_digest(found) == final["sha256"], len(found))
    res.differences += _compare_tensors(final["tensors"], found)
    res.differences += _compare_files(receipt.get("files") or {}, directory)
    if data is not None:
        res.differences += _verify_data(receipt, directory, data)
        res.data_checked = True
    return res


def format_result(res: VerifyResult) -> str:
    """The verdict for the terminal: OK, or a table of every difference."""
    head = (f"overall weights digest: {'matches' if res.overall_match else 'DIFFERS'} "
            f"({res.n_tensors} tensors in {res.model_dir})")
    if res.ok:
        what = "weights, files" + (" and data rows" if res.data_checked else "")
        return f"{head}\nOK: {what} match {res.receipt}"
    width = max(len(d.name) for d in res.differences) if res.differences else 0
    lines = [head, f"DIFFERS: {len(res.differences)} difference(s) from {res.receipt}", "",
             f"{'kind':<10} {'name':<{width}}  detail"]
    lines += [f"{d.kind:<10} {d.name:<{width}}  {d.detail}" for d in res.differences]
    return "\n".join(lines)
