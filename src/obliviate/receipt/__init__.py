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
is hashed without its (zero-effect) adapters, so θ0 and final digests compare like for li
The package face only: `digests.py` (the canonical hashes), `build.py` (write and load a receipt), `verify.py`
(check one), `card.py` (the model card).
"""
from __future__ import annotations

from obliviate.receipt.build import (
    attach_audit,
    build_receipt,
    library_version,
    load_receipt,
    package_versions,
    scalar_metrics,
    seeds,
    utc_now,
    write_receipt,
)
from obliviate.receipt.digests import (
    CARD_NAME,
    HASHING,
    PACKAGES,
    RECEIPT_NAME,
    RECEIPT_VERSION,
    ST_DTYPES,
    UNHASHED,
    dir_hashes,
    encoded_digests,
    model_hashes,
    other_files,
    row_digest,
    rows_digest,
    safetensors_hashes,
    side_record,
    tensor_digest,
    tokenizer_info,
    torch_tensor_hash,
    weight_files,
    weights_digest,
)
from obliviate.receipt.verify import (
    Difference,
    VerifyResult,
    format_result,
    verify,
)

__all__ = [
    "CARD_NAME",
    "Difference",
    "HASHING",
    "PACKAGES",
    "RECEIPT_NAME",
    "RECEIPT_VERSION",
    "ST_DTYPES",
    "UNHASHED",
    "VerifyResult",
    "attach_audit",
    "build_receipt",
    "dir_hashes",
    "encoded_digests",
    "format_result",
    "library_version",
    "load_receipt",
    "model_hashes",
    "other_files",
    "package_versions",
    "row_digest",
    "rows_digest",
    "safetensors_hashes",
    "scalar_metrics",
    "seeds",
    "side_record",
    "tensor_digest",
    "tokenizer_info",
    "torch_tensor_hash",
    "utc_now",
    "verify",
    "weight_files",
    "weights_digest",
    "write_receipt",
]
