"""Model sources checked before any weights load (no torch import here): a local directory with a config and
safetensors weights, a GGUF file or alias, or a hub id (reachable, or cached when offline); an absolute or relative
path is never taken for a hub id. Also what a model's config.json says without loading it (its layer count).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from obliviate import hub
from obliviate.errors import ConfigError, ObliviateError
from obliviate.modeling import gguf

PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")



def _weights(d: Path) -> tuple[list[str], list[str]]:
    """(safetensors files, pickle weight files) in a model directory."""
    safe = sorted(p.name for p in d.glob("*.safetensors"))
    pickles = sorted({p.name for pattern in PICKLE_WEIGHTS for p in d.glob(pattern)})
    return safe, pickles


def _check_model_dir(d: Path, key: str, path: str) -> str:
    if not d.is_dir():
        raise ObliviateError(f"{key} {path} is a file, not a model directory; give a directory holding config.json "
                             "and *.safetensors (e.g. the output directory of `obliviate finetune`) or a .gguf file")
    if not (d / "config.json").is_file():
        raise ObliviateError(f"{key} {path} has no config.json: not a model directory; give the output directory of "
                             "`obliviate finetune`/`unlearn`, a .gguf file, an alias such as smollm2-135m-instruct, "
                             "or a hub id")
    safe, pickles = _weights(d)
    if not safe and pickles:
        raise ObliviateError(
            f"{key} {path} holds only PyTorch pickle weights ({', '.join(pickles[:3])}); obliviate loads safetensors "
            "only (a pickle can run code when loaded). Convert once: python -c \"from transformers import "
            f"AutoModelForCausalLM as M; M.from_pretrained('{path}').save_pretrained('{path}-safetensors')\" "
            f"(copy the tokenizer files too), then use {path}-safetensors")
    if not safe:
        raise ObliviateError(f"{key} {path} has a config.json but no weights (*.safetensors); point {key} at a "
                             "complete model directory")
    return f"local directory {path} ({len(safe)} safetensors file(s))"


def _check_hub_id(path: str, key: str, filenames: tuple[str, ...] = ("config.json",)) -> str:
    """A hub id: cached when offline (one of `filenames` is), else the hub must be reachable (checked once, fast);
    under `validate --offline` an uncached one is named as not checked."""
    if hub.skipping() and all(hub_cached_file(path, name) is None for name in filenames):
        return f"hub id {path} (skipped: not fetched with --offline; its files are checked when it loads)"
    if hub.offline():
        if all(hub_cached_file(path, name) is None for name in filenames):
            raise ObliviateError(f"{key} {path!r}: no such folder in {Path.cwd()}, and as a hub id it is not in the "
                                 "hub cache and HF_HUB_OFFLINE=1 forbids downloading it; a folder: create it first (a "
                                 "preset's header names the command that writes it) or correct the path; a hub id: "
                                 "download it first with network access")
        return f"hub id {path} (cached)"
    hub.require_hub(f"{key} {path!r}")
    return f"hub id {path} (hub reachable; files not checked before loading)"


def _missing(path: str, key: str, what: str = "model directory") -> ObliviateError:
    return ObliviateError(f"{key} {path!r} is not a {what}: it does not exist (and a path is never a hub id); "
                          "check the path")


def check_model_source(path: str, key: str = "model.path") -> str:
    """What kind of model source `path` is, after checking everything that needs no weights; an error otherwise."""
    if gguf.is_gguf_source(path):
        gguf.require_gguf_package()
        file = gguf.gguf_file(path)
        cached = (gguf.cached_dir(file) / gguf.MARKER).is_file()
        return f"GGUF file {file} ({'converted, in' if cached else 'converted on first load into'} {gguf.cache_root()})"
    p = Path(path).expanduser()
    if p.exists():
        return _check_model_dir(p, key, path)
    if not hub.looks_like_repo_id(path):
        raise _missing(path, key)
    return _check_hub_id(path, key)


def check_tokenizer_source(path: str, key: str = "model.tokenizer") -> str:
    """A tokenizer directory (or tokenizer file) that exists, or a hub id as for models."""
    p = Path(path).expanduser()
    if p.exists():
        return f"local {'directory' if p.is_dir() else 'file'} {path}"
    if not hub.looks_like_repo_id(path):
        raise _missing(path, key, "tokenizer directory")
    return _check_hub_id(path, key, ("tokenizer_config.json", "tokenizer.json", "config.json"))


def check_optional_model(path: str | None, key: str) -> str | None:
    """Auxiliary models that degrade to a note when unavailable (embedding, NLI): only a path to nothing is an error."""
    if path and not Path(path).expanduser().exists() and not hub.looks_like_repo_id(path):
        raise _missing(path, key, "model")
    return path


def hub_cached_file(repo_id: str, filename: str) -> str | None:
    """The local path of `filename` of hub model `repo_id` in the hub cache, or None (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename)
    except Exception:  # invalid id, no cache: not cached
        return None
    return found if isinstance(found, str) else None


def model_config(path: str) -> dict | None:
    """The model's config.json as a dict when it can be read without loading weights or the network."""
    if gguf.is_gguf_source(path):
        try:
            source = gguf.gguf_file(path)
            file = Path(gguf.cached_dir(source)) / "config.json"
        except ObliviateError:
            return None
        if not file.is_file():  # not converted yet: the header still says how many layers
            n = gguf.header_layers(source)
            return None if n is None else {"num_hidden_layers": n}
    elif Path(path).expanduser().is_dir():
        file = Path(path).expanduser() / "config.json"
    else:
        cached = hub_cached_file(path, "config.json") if hub.looks_like_repo_id(path) else None
        if cached is None:
            return None
        file = Path(cached)
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def layer_count(config: Mapping[str, Any] | None) -> int | None:
    """Decoder layers of a model config (its text config for multimodal models); None when it does not say."""
    if not isinstance(config, Mapping):
        return None
    for key in LAYER_KEYS:
        if isinstance(config.get(key), int) and not isinstance(config.get(key), bool):
            return config[key]
    return layer_count(config.get("text_config"))


def check_layer_indices(layers: Any, n_layers: int, key: str, *, negative: bool = True) -> None:
    """Every index of `layers` (None = all) addresses one of the model's `n_layers` layers."""
    if layers is None:
        return
    low = -n_layers if negative else 0
    bad = [i for i in layers if not low <= i < n_layers]
    if bad:
        valid = f"0..{n_layers - 1}" + (f", or {-n_layers}..-1 counted from the last" if negative else "")
        raise ConfigError(f"{key}={list(layers)}: layer index {bad[0]} is out of range for this model, which has "
                          f"{n_layers} layers (valid: {valid})")
