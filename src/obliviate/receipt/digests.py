"""The canonical digests of a receipt (receipt_version 1; the package docstring defines them): tensors, weights,
rows, files, and the records built from them. No torch at import time."""
from __future__ import annotations

import hashlib
import json
import mmap
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from obliviate.errors import ObliviateError
from obliviate.files import file_sha256
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
