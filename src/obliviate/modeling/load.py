"""Load any Hugging Face causal LM + tokenizer by local path or hub id, and save runs atomically."""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from obliviate.errors import ObliviateError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# The class flag transformers checks before dispatching to a backend (modeling_utils *_can_dispatch).
SUPPORT_FLAGS = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn", "flash_attention": "_supports_flash_attn"}

logger = logging.getLogger(__name__)


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ObliviateError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(path: str, *, trust_remote_code: bool = False) -> Any:
    """AutoTokenizer from a local directory or hub id; pad token falls back to EOS."""
    from transformers import AutoTokenizer

    from obliviate.modeling.gguf import resolve_gguf

    path = resolve_gguf(path)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ObliviateError(f"could not load a tokenizer from {path!r}: {exc}. "
                             "Give a local directory with tokenizer files or a reachable hub id.") from None
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str, *, dtype: str = "float32", attn_implementation: str = "sdpa",
               trust_remote_code: bool = False) -> Any:
    """AutoModelForCausalLM (safetensors only) from a local directory, hub id, .gguf file or GGUF alias."""
    from transformers import AutoModelForCausalLM

    from obliviate.modeling.gguf import resolve_gguf

    path = resolve_gguf(path)
    p = Path(path)
    if (p.exists() or str(path).startswith((".", "/"))) and not (p / "config.json").is_file():
        raise ObliviateError(f"{path!r} is not a model directory (no config.json); give the output directory "
                             "of `obliviate finetune`/`unlearn`, a .gguf file, an alias such as "
                             "smollm2-135m-instruct, or a hub id")
    attn_implementation = choose_attn_implementation(path, attn_implementation, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_dtype(dtype), attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code, use_safetensors=True,
        )
    except Exception as exc:
        raise ObliviateError(f"could not load a causal LM from {path!r}: {exc}") from None
    return model


def _causal_lm_class(path: str, trust_remote_code: bool) -> type | None:
    """The built-in AutoModelForCausalLM class for the config at `path`; None when unknown (remote code, no config)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        return AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:  # from_pretrained itself reports what is wrong with the path
        return None


def _unsupported(cls: type, implementation: str) -> bool:
    """Whether transformers would refuse `implementation` for `cls` (its class flag says no)."""
    for prefix, flag in SUPPORT_FLAGS.items():
        if implementation.startswith(prefix):
            return not getattr(cls, flag, True)
    return False


def choose_attn_implementation(path: str, requested: str, *, trust_remote_code: bool = False) -> str:
    """`requested`, or "eager" for an architecture transformers will not run with it (Gemma 2 has no sdpa:
    its attention-logit soft-capping runs on eager, flash or flex only); the switch is logged."""
    cls = _causal_lm_class(path, trust_remote_code) if requested != "eager" else None
    if cls is None or not _unsupported(cls, requested):
        return requested
    logger.warning("%s does not support attn_implementation=%r in transformers; loading it with 'eager' instead.",
                   cls.__name__, requested)
    return "eager"


def load_pretrained(path: str, tokenizer: str | None = None, **kw: Any) -> tuple[Any, Any]:
    """(model, tokenizer) from one path (tokenizer from `tokenizer` when given); GGUF sources convert once."""
    from obliviate.modeling.gguf import resolve_gguf

    path = resolve_gguf(path)
    model = load_model(path, **kw)  # first: its error says what a model directory needs
    return model, load_tokenizer(tokenizer or path, trust_remote_code=kw.get("trust_remote_code", False))


def check_output_dir(path: str | Path, overwrite: bool) -> Path:
    """Refuse to clobber an existing non-empty output directory unless overwrite is set."""
    p = Path(path)
    if not str(path):
        raise ObliviateError("output_dir is empty: set output_dir=<directory> for the run's results")
    if p.exists() and (not p.is_dir() or any(p.iterdir())) and not overwrite:
        raise ObliviateError(f"output directory {p} already exists and is not empty; "
                             "choose another output_dir or pass overwrite=true to replace it")
    return p


@contextmanager
def atomic_dir(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path`, on error it is removed.

    So a failed run leaves no partial output and never destroys what was already there.
    """
    final = check_output_dir(path, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        backup = final.parent / f".{final.name}.old-{tmp.name[-8:]}"
        final.rename(backup)
        tmp.rename(final)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        tmp.rename(final)


def save_model(directory: Path, model: Any, tokenizer: Any) -> None:
    """Write model weights (safetensors), config and tokenizer into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def write_json(path: Path, data: Any) -> None:
    """JSON with sorted keys and 2-space indent (NaN is written as null)."""
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _clean(x: Any) -> Any:
    import math

    import numpy as np

    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, np.integer)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
