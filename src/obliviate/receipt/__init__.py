"""The receipt beside every unlearned model (receipt.json) and `obliviate verify`, which re-checks it.

Canonical hashes (receipt_version 1), so a third party can recompute every digest with hashlib alone:

- tensor:  sha256( f"{dtype}|{shape}\\n".encode() + raw bytes ), where dtype is torch's name without the
  "torch." prefix ("float32", "bfloat16", ...), shape is the sizes joined by "," ("" for a scalar), and the
  raw bytes are the tensor's C-contiguous little-endian element bytes (exactly a safetensors data slice).
- weights: sha256 over "name:digest\\n" lines, sorted by tensor name.
- row:     sha256 of the compact JSON {"input_ids":[...],"labels":[...]} (keys sorted, no spaces) of the
  encoded example the training saw (obliviate.train.unlearn.encode_rows: prompt labels are -100).
- rows:    sha256 over the row digests joined by "\\n", in row order.
- file:    sha256 of the file's bytes (config.json, tokenizer files, metrics.json, ...).

Final weights are hashed from the saved *.safetensors files themselves (what `verify` reads: a tied
tensor that safetensors drops is not in them, a LoRA run saves merged weights unless merge_on_save is
off). The starting weights θ0 are hashed in memory right after loading, before training: tensors that
share storage (tied embeddings) are listed once under the name save_pretrained keeps, and a LoRA model
is hashed without its (zero-effect) adapters, so θ0 and final digests compare like for like.

This module imports no torch at import time: `verify` of the weights alone needs none.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from obliviate.errors import ObliviateError
from obliviate.files import file_sha256, write_json_atomic
from obliviate.modeling import chat

RECEIPT_VERSION = 1
RECEIPT_NAME = "receipt.json"
CARD_NAME = "README.md"
PACKAGES = ("torch", "transformers", "accelerate", "peft", "datasets", "safetensors", "tokenizers", "numpy")
# safetensors dtype codes -> torch dtype names (the canonical dtype string)
ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
             "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
             "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64"}
UNHASHED = {RECEIPT_NAME}
HASHING = {  # the canonical forms (module docstring), recorded in every receipt
    "tensor": "sha256(f'{dtype}|{shape}\\n' + raw C-contiguous little-endian bytes); dtype as torch names it "
              "without 'torch.' (float32, bfloat16); shape = sizes joined by ',' ('' for a scalar)",
    "weights": "sha256 over 'name:sha256\\n' lines sorted by name",
    "row": "sha256 of compact JSON {\"input_ids\":[...],\"labels\":[...]} (sorted keys, separators ',' ':') of "
           "the encoded example (obliviate.train.unlearn.encode_rows; prompt labels -100)",
    "rows": "sha256 over the row digests joined by '\\n', in row order",
    "file": "sha256 of the file bytes",
    "start": "θ0 in memory after loading, before training; tied tensors once (the name save_pretrained keeps); "
             "LoRA adapters left out",
    "final": "every tensor of the saved *.safetensors files",
}  # files of the output directory whose digest the receipt does not record


# ---------------------------------------------------------------- canonical hashes


def tensor_digest(dtype: str, shape: Sequence[int], data: bytes | memoryview) -> str:
    """The canonical SHA-256 of one tensor from its dtype name, shape and raw element bytes."""
    h = hashlib.sha256(f"{dtype}|{','.join(str(int(s)) for s in shape)}\n".encode())
    h.update(data)
    return h.hexdigest()


def weights_digest(tensors: Mapping[str, Mapping[str, Any]]) -> str:
    """The overall digest: SHA-256 over sorted "name:sha256" lines."""
    return hashlib.sha256("".join(f"{n}:{tensors[n]['sha256']}\n" for n in sorted(tensors)).encode()).hexdigest()


def torch_tensor_hash(t: Any) -> dict[str, Any]:
    """{sha256, dtype, shape} of an in-memory torch tensor (copied to the CPU, made contiguous)."""
    import torch

    x = t.detach().to("cpu").contiguous()
    dtype = str(x.dtype).removeprefix("torch.")
    raw = x.reshape(-1).view(torch.uint8).numpy() if x.numel() else b""
    return {"sha256": tensor_digest(dtype, list(x.shape), memoryview(raw)), "dtype": dtype, "shape": list(x.shape)}


def _dropped_aliases(model: Any) -> set[str]:
    """Names save_pretrained leaves out when they share storage with another tensor (tied weights)."""
    keys = getattr(model, "_tied_weights_keys", None) or ()
    return set(keys.keys() if isinstance(keys, dict) else keys)


def _base_state(model: Any) -> tuple[Any, dict[str, Any]]:
    """(the plain transformers model, its state dict); a peft model's adapters are left out, names unwrapped."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        base = model.get_base_model()
        sd = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
        return base, sd
    return model, model.state_dict()


def model_hashes(model: Any) -> dict[str, dict[str, Any]]:
    """name -> {sha256, dtype, shape} of an in-memory model, each storage once (θ0, before training)."""
    base, sd = _base_state(model)
    dropped = _dropped_aliases(base)
    groups: dict[tuple[int, int, tuple[int, ...], str], list[str]] = {}
    for name, t in sd.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), str(t.dtype))
        groups.setdefault(key, []).append(name)
    keep = {next((n for n in names if n not in dropped), names[0]) for names in groups.values()}
    return {n: torch_tensor_hash(t) for n, t in sd.items() if n in keep}


def safetensors_hashes(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {sha256, dtype, shape} of every tensor in one .safetensors file, read raw (no torch)."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            view = memoryview(buf)
            try:
                return _hash_slices(view)
            finally:
                view.release()
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ObliviateError(f"{path}: not a readable safetensors file ({exc})") from None


def _hash_slices(view: memoryview) -> dict[str, dict[str, Any]]:
    """Hash each tensor's data slice of a mapped safetensors file (header: u64 length, then JSON)."""
    (n,) = struct.unpack("<Q", view[:8])
    header = json.loads(bytes(view[8:8 + n]))
    start, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if start + e > len(view):
            raise ValueError(f"tensor {name} runs past the end of the file")
        dtype = ST_DTYPES.get(info["dtype"], info["dtype"].lower())
        part = view[start + b:start + e]
        try:
            out[name] = {"sha256": tensor_digest(dtype, info["shape"], part), "dtype": dtype,
                         "shape": list(info["shape"])}
        finally:
            part.release()
    return out


def weight_files(model_dir: Path) -> list[Path]:
    """The *.safetensors files of a model directory (one file, shards, or a LoRA adapter), sorted."""
    return sorted(p for p in model_dir.glob("*.safetensors") if p.is_file())


def dir_hashes(model_dir: Path) -> dict[str, dict[str, Any]]:
    """name -> {sha256, dtype, shape, file} over every safetensors file of `model_dir`."""
    out: dict[str, dict[str, Any]] = {}
    for path in weight_files(model_dir):
        for name, entry in safetensors_hashes(path).items():
            out[name] = {**entry, "file": path.name}
    return out


def other_files(out: Path) -> dict[str, str]:
    """file name -> sha256 of the output directory's files other than weights and the receipt itself."""
    return {p.name: file_sha256(p) for p in sorted(out.iterdir())
            if p.is_file() and p.suffix != ".safetensors" and p.name not in UNHASHED}


def row_digest(input_ids: Sequence[int], labels: Sequence[int]) -> str:
    """The canonical SHA-256 of one encoded example."""
    text = json.dumps({"input_ids": [int(i) for i in input_ids], "labels": [int(i) for i in labels]},
                      separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def rows_digest(digests: Iterable[str]) -> str:
    """The digest of a whole side: SHA-256 over its row digests joined by newlines."""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def encoded_digests(tokenizer: Any, rows: Sequence[Any], max_length: int, windows: str = "document") -> list[str]:
    """Row digests of `rows` encoded exactly as training encodes them."""
    from obliviate.train.unlearn import encode_rows

    return [row_digest(e.input_ids, e.labels) for e in encode_rows(tokenizer, rows, max_length, windows)]


def tokenizer_info(tokenizer: Any, max_length: int) -> dict[str, Any]:
    """The tokenisation settings that produced the row digests."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), separators=(",", ":"), ensure_ascii=False)
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else json.dumps(template, sort_keys=True) if template else None
    return {"max_length": max_length, "chat_template": bool(template),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
            "tokenizer": str(getattr(tokenizer, "name_or_path", "")), "tokenizer_class": type(tokenizer).__name__,
            "vocab_size": len(tokenizer), "vocab_sha256": hashlib.sha256(vocab.encode()).hexdigest(),
            "bos_token_id": getattr(tokenizer, "bos_token_id", None),
            "eos_token_id": getattr(tokenizer, "eos_token_id", None),
            "chat_system": chat.get_format(tokenizer)["system"] if template else None,
            "chat_template_args": chat.resolved_args(tokenizer) if template else None,
            "prompt_template": chat.raw_template(tokenizer)}


def side_record(split: str, rows: Sequence[Any], digests: list[str]) -> dict[str, Any]:
    """The receipt's entry of one data side."""
    return {"split": split, "n_rows": len(rows), "n_encoded": len(digests), "sha256": rows_digest(digests),
            "rows": digests}


# ---------------------------------------------------------------- the receipt


def package_versions() -> dict[str, str | None]:
    """python and the installed versions of the packages that decide the numbers (None: not installed)."""
    import platform
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def library_version() -> str:
    """obliviate's installed version."""
    from importlib import metadata

    try:
        return metadata.version("obliviate")
    except metadata.PackageNotFoundError:
        return "unknown"


def seeds(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every `seed` key of the resolved config, by dotted path (train.seed, method.forget_args.seed, ...)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(seeds(value, f"{prefix}{key}."))
        elif key == "seed" or key.endswith("_seed"):
            out[prefix + key] = value
    return out


def scalar_metrics(metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The numeric (and null) metrics of an evaluation; lists such as generations stay in metrics.json."""
    if not metrics:
        return None
    return {k: v for k, v in metrics.items() if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}


def utc_now() -> str:
    """Now, UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def build_receipt(cfg: Any, tokenizer: Any, forget: Sequence[Any], retain: Sequence[Any], theta0: Mapping[str, Any],
                  final: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The receipt of an `unlearn` run (without the other files' digests, which `write_receipt` adds)."""
    from obliviate.config import to_dict
    from obliviate.train.unlearn import resolve_method

    config, resolved = to_dict(cfg), resolve_method(cfg.method).settings()  # defaults filled in
    ml, win = cfg.data.max_length, cfg.data.windows
    shared = set(final) & set(theta0)  # none when a LoRA run saves its adapters only (merge_on_save=false)
    return {
        "receipt_version": RECEIPT_VERSION, "created": utc_now(), "obliviate_version": library_version(),
        "packages": package_versions(), "config": config,
        "seeds": {**seeds(config), **seeds(resolved, "method.resolved.")},
        "method": {"label": cfg.method.label, "forget": cfg.method.forget, "retain": cfg.method.retain,
                   "rule": cfg.method.combine.rule, "resolved": resolved},
        "data": {"source": cfg.data.source, "format": cfg.data.format, "tokenization": tokenizer_info(tokenizer, ml),
                 "forget": side_record(cfg.data.forget_split, forget, encoded_digests(tokenizer, forget, ml, win)),
                 "retain": side_record(cfg.data.retain_split, retain, encoded_digests(tokenizer, retain, ml, win))},
        "weights": {"start": {"source": cfg.model.path, "dtype": cfg.model.dtype, "sha256": weights_digest(theta0),
                              "n_tensors": len(theta0), "tensors": dict(theta0)},
                    "final": {"sha256": weights_digest(final), "n_tensors": len(final), "tensors": dict(final)},
                    "changed": sorted(n for n in shared if final[n]["sha256"] != theta0[n]["sha256"]) if shared else None},
        "metrics": {"before": None, "after": scalar_metrics(metrics.get("eval")),
                    "note": "before: θ0 is not evaluated by `unlearn`; after: the run's own evaluation "
                            "(metrics.json 'eval'), null when eval was off",
                    "train_seconds": metrics.get("train_seconds"), "steps": len(metrics.get("history") or [])},
        "audit": None,  # set by attach_audit (obliviate audit's verdict)
        "files": {},
        "hashing": HASHING,
    }


def write_receipt(out: Path, cfg: Any, tokenizer: Any, forget: Sequence[Any], retain: Sequence[Any],
                  theta0: Mapping[str, Any], metrics: Mapping[str, Any], base: Any = None,
                  audit: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Hash the saved weights of `out`, write the model card and receipt.json into it; return the receipt.
    `base`: the card's `BaseFacts` when the caller knows them better than `cfg.model.path` says (the demo);
    `audit`: an audit verdict already known (the demo audits before it writes), else `attach_audit` adds it later."""
    from obliviate.receipt.card import model_card

    receipt = build_receipt(cfg, tokenizer, forget, retain, theta0, dir_hashes(out), metrics)
    receipt["audit"] = dict(audit) if audit else None
    examples = [getattr(r, "question", r) for r in list(forget)[:3]]
    (out / CARD_NAME).write_text(model_card(receipt, examples, metrics.get("eval"), base), encoding="utf-8")
    receipt["files"] = other_files(out)
    write_json_atomic(out / RECEIPT_NAME, receipt)
    return receipt


def attach_audit(receipt_path: str | Path, verdict: Mapping[str, Any]) -> None:
    """Set the receipt's `audit` key to an audit verdict, rewriting receipt.json atomically."""
    path = Path(receipt_path)
    receipt = load_receipt(path)
    receipt["audit"] = dict(verdict)
    write_json_atomic(path, receipt)


def load_receipt(path: str | Path) -> dict[str, Any]:
    """A receipt read and checked for the keys `verify` needs; a clear error otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ObliviateError(f"receipt {path} not found (an unlearn output directory has one: <dir>/receipt.json)")
    try:
        receipt = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ObliviateError(f"receipt {path} is not valid JSON ({exc}); it is corrupt or not a receipt") from None
    version = receipt.get("receipt_version") if isinstance(receipt, dict) else None
    if not isinstance(version, int):
        raise ObliviateError(f"{path} is not an obliviate receipt (no integer receipt_version)")
    if version > RECEIPT_VERSION:
        raise ObliviateError(f"receipt {path} has receipt_version {version}; this obliviate reads up to "
                             f"{RECEIPT_VERSION} (upgrade obliviate)")
    try:
        final = receipt["weights"]["final"]
        ok = isinstance(final["tensors"], dict) and isinstance(final["sha256"], str)
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise ObliviateError(f"receipt {path} is incomplete: weights.final.tensors / weights.final.sha256 missing")
    return receipt


# ---------------------------------------------------------------- verify


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
    from obliviate.data.splits import load_data
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
