"""Load any Hugging Face causal LM + tokenizer by local path or hub id, and save runs atomically."""
from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from obliviate import files
from obliviate.errors import ConfigError, ObliviateError
from obliviate.modeling import chat, sources
from obliviate.modeling.gguf import resolve_gguf
from obliviate.modeling.tokenizer_files import save_tokenizer

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

    path = resolve_gguf(path)
    sources.check_tokenizer_source(path, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ObliviateError(f"could not load a tokenizer from {path!r}: {exc}. "
                             "Give a local directory with tokenizer files or a reachable hub id.") from None
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    if Path(path).is_dir():  # the prompt format a model was unlearned with travels with it (modeling/chat.py)
        try:
            chat.load(tok, path)
        except ValueError as exc:
            raise ObliviateError(str(exc)) from None
    return tok


def require_bitsandbytes(what: str, fix: str) -> None:
    """ConfigError unless bitsandbytes is installed and a CUDA GPU is present (its 4-bit weights, 8-bit and paged
    optimizers run there): the message names `what` asked for it and `fix`."""
    import importlib.util

    import torch

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(f"{what} needs bitsandbytes: pip install bitsandbytes (or {fix})")
    if not torch.cuda.is_available():
        raise ConfigError(f"{what} runs on a CUDA GPU only (bitsandbytes' kernels), and this machine has none; {fix}")


def four_bit_config() -> Any:
    """QLoRA's quantisation of the base weights: NF4, double quantised, bf16 compute (Dettmers et al. 2023)."""
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def load_model(path: str, *, dtype: str = "float32", attn_implementation: str = "sdpa",
               trust_remote_code: bool = False, load_in_4bit: bool = False) -> Any:
    """AutoModelForCausalLM (safetensors only) from a local directory, hub id, .gguf file or GGUF alias; with
    `load_in_4bit`, its weights in 4-bit NF4 on the GPU (`four_bit_config`)."""
    from transformers import AutoModelForCausalLM

    path = resolve_gguf(path)
    sources.check_model_source(path, "model")  # no config / pickle-only weights / unreachable hub: fail now, clearly
    attn_implementation = choose_attn_implementation(path, attn_implementation, trust_remote_code=trust_remote_code)
    extra: dict[str, Any] = {}
    if load_in_4bit:
        require_bitsandbytes("model.load_in_4bit=true (QLoRA)", "set model.load_in_4bit=false")
        import torch

        extra = {"quantization_config": four_bit_config(), "device_map": {"": torch.cuda.current_device()}}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_dtype(dtype), attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code, use_safetensors=True, **extra,
        )
    except Exception as exc:
        raise ObliviateError(f"could not load a causal LM from {path!r}: {exc}") from None
    return model


def eval_device() -> Any:
    """Where obliviate evaluates a model it loaded: this process's CUDA GPU (cuda:LOCAL_RANK under a launcher) when
    one is visible, else the CPU; the environment variable OBLIVIATE_EVAL_DEVICE (cpu, cuda, cuda:N) overrides.
    Training places its student through accelerate; this is for θ0, reference and retain models that only score."""
    asked = os.environ.get("OBLIVIATE_EVAL_DEVICE", "").strip()
    if asked:
        try:
            return torch.device(asked)
        except RuntimeError:
            raise ConfigError(f"OBLIVIATE_EVAL_DEVICE={asked!r} is not a device: use cpu, cuda or cuda:N") from None
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0") or 0))
    return torch.device("cpu")


def to_eval_device(model: Any) -> Any:
    """`model` on eval_device() (moved in place); a model bitsandbytes or a device map placed stays where it is."""
    if model is None or getattr(model, "is_loaded_in_4bit", False) or getattr(model, "hf_device_map", None):
        return model
    device = eval_device()
    if next(model.parameters()).device != device:
        model.to(device)
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

    path = resolve_gguf(path)
    model = load_model(path, **kw)  # first: its error says what a model directory needs
    return model, load_tokenizer(tokenizer or path, trust_remote_code=kw.get("trust_remote_code", False))


def check_output_dir(path: str | Path, overwrite: bool, inputs: Mapping[str, Any] | None = None) -> Path:
    """Refuse an output directory that exists (unless overwrite), cannot be written, or whose replacement would
    delete an input (`inputs`: config key -> path) or the current directory (obliviate.files)."""
    return files.check_output_dir(path, overwrite, inputs)


@contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Hold Ctrl-C back while the block runs (main thread only); the list records whether one came."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def _swap_in(tmp: Path, final: Path) -> None:
    """Replace `final` (a directory, a file or nothing) by `tmp`; on any failure the old `final` is put back.

    Two renames cannot be one atomic step, so Ctrl-C is held back until both are done and the old
    output is removed: an interrupt can never leave `final` missing or a hidden `.NAME.old-*` behind."""
    with _sigint_deferred() as interrupted:
        backup = final.parent / f".{final.name}.old-{tmp.name[-8:]}" if final.exists() or final.is_symlink() else None
        try:
            if backup is not None:
                final.rename(backup)
            tmp.rename(final)
        except BaseException:
            if backup is not None and not (final.exists() or final.is_symlink()):
                backup.rename(final)
            files.remove_path(tmp)
            raise
        if backup is not None:
            files.remove_path(backup)
    if interrupted:
        raise KeyboardInterrupt(f"the interrupt came while {final} was being replaced; its new content is complete")


@contextmanager
def atomic_dir(path: str | Path, overwrite: bool = False, inputs: Mapping[str, Any] | None = None) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path`, on error it is removed.

    So a failed run leaves no partial output and never destroys what was already there. The directory
    gets the permissions the umask gives a new directory (mkdtemp alone would make it private, 0700).
    """
    final = check_output_dir(path, overwrite, inputs)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        tmp.chmod(0o777 & ~files.current_umask())
        yield tmp
    except BaseException:
        files.remove_path(tmp)
        raise
    _swap_in(tmp, final)


def save_model(directory: Path, model: Any, tokenizer: Any) -> None:
    """Write model weights (safetensors), config and tokenizer into `directory` (tokenizer files transformers 4.x
    reads too: modeling/tokenizer_files.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(tokenizer, directory)
    chat.save(tokenizer, directory)


