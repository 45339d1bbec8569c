"""Writing a receipt: build_receipt / write_receipt beside an unlearned model (+ its model card), attach_audit,
load_receipt."""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from obliviate.config import to_dict
from obliviate.errors import ObliviateError
from obliviate.files import write_json_atomic
from obliviate.receipt.card import model_card
from obliviate.receipt.digests import (
    CARD_NAME,
    HASHING,
    PACKAGES,
    RECEIPT_NAME,
    RECEIPT_VERSION,
    dir_hashes,
    encoded_digests,
    other_files,
    side_record,
    tokenizer_info,
    weights_digest,
)


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
