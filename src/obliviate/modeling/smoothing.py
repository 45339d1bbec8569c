"""Attention temperature for the ASU forget-teacher (arXiv 2603.01285): softmax(QKᵀ/(τ√d))V on chosen layers.

How it works. transformers routes every attention call through `AttentionInterface`, passing the
attention module (which knows its `layer_idx`) and `scaling=module.scaling`. We register one wrapper per
stock backend under the name `obliviate_<backend>` (and the stock mask function under the same name, since
mask creation looks masks up by that name), point the model's config at it, and store τ as a plain float
attribute on the chosen attention modules. The wrapper calls the stock function with `scaling / τ`, so one
registered function serves every model, layer set and τ, and τ = 1 runs exactly the stock code.

Conventions that matter for correctness:
- Soft-capping (Gemma 2: logits z = c·tanh(s/c), s = QKᵀ·scaling): we divide the cap as well, which gives
  (c/τ)·tanh(s/c) = z/τ, i.e. the softmax sees the stock capped logits divided by τ and p_τ ∝ p^(1/τ) holds
  exactly. Dividing only `scaling` would instead cap smaller logits and leave saturated heads sharp.
- Additive terms that are not QKᵀ (T5 `position_bias`, gpt-oss attention sinks) are left alone: the paper's
  formula tempers QKᵀ only.
- Backends: eager, sdpa and flex_attention. Flash-attention backends (and Hub kernels) choose their kernel from
  the configured implementation *name*, so a renamed wrapper cannot reach them; switch such a model (or its
  teacher copy) to sdpa first. Models whose attention does not call the interface raise `SmoothingError`.
- The backend switch lives in `config._attn_implementation`, which `save_pretrained` does not write.
- GPT-2's `reorder_and_upcast_attn` (also Decision Transformer): stock code computes QKᵀ and the softmax in fp32
  only when the implementation is literally named "eager", a name our wrapper cannot carry. The eager wrapper
  therefore runs that fp32 path itself for modules asking for it (`_upcast_eager`); with sdpa the stock model
  ignores the flag, and so do we.
"""
from __future__ import annotations

import copy
import functools
import inspect
import operator
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import maybe_autocast

from obliviate.errors import ObliviateError
from obliviate.modeling.teacher import tau_problem

PREFIX = "obliviate_"
SUPPORTED_BACKENDS = ("eager", "sdpa", "flex_attention")
TAU_ATTR = "_obliviate_tau"  # float on an attention module; absent means τ = 1 (stock)
PROBE_ATTR = "_obliviate_entropy_probe"  # list on an attention module while attention_entropy runs

__all__ = [
    "SmoothingError",
    "SmoothingValueError",
    "smooth_attention",
    "remove_smoothing",
    "smoothed_teacher",
    "smoothing_info",
    "attention_entropy",
    "is_smoothed",
]


class SmoothingError(ObliviateError):
    """The model's attention cannot be tempered through the transformers attention interface."""


class SmoothingValueError(SmoothingError, ValueError):
    """A bad τ or layer index: a ValueError for library callers, a clean CLI error (ObliviateError) for users."""


# ----------------------------------------------------------------------------- the registered wrapper


@functools.cache
def _eager_function(cls: type) -> Callable[..., Any]:
    """The stock eager function an attention class falls back to (the one its forward's module defines)."""
    # The model file resolves `eager_attention_forward` in its own globals (GPT-2's differs from Llama's).
    function = inspect.unwrap(cls.forward).__globals__.get("eager_attention_forward")
    if function is None:
        raise SmoothingError(
            f"{cls.__name__} has no module-level `eager_attention_forward`, so the eager backend cannot be "
            f"smoothed; use attn_implementation='sdpa'."
        )
    return function


def _tempered_kwargs(kwargs: dict[str, Any], tau: float, head_dim: int) -> dict[str, Any]:
    """ASU (arXiv 2603.01285): scaling → scaling/τ, logits QKᵀ/(τ√d); a soft-cap c → c/τ (module doc)."""
    kwargs = dict(kwargs)
    scaling = kwargs.get("scaling")
    # Backends treat scaling=None as 1/√head_dim (torch sdpa, GPT-2/Gemma eager), so divide that default.
    kwargs["scaling"] = (head_dim**-0.5 if scaling is None else scaling) / tau
    if kwargs.get("softcap") is not None:
        kwargs["softcap"] = kwargs["softcap"] / tau
    return kwargs


def _wants_upcast(module: nn.Module) -> bool:
    """GPT-2-style attention asking for fp32 scores and softmax (stock honours it on the eager backend only)."""
    return bool(getattr(module, "reorder_and_upcast_attn", False)) and hasattr(module, "_upcast_and_reordered_attn")


def _upcast_eager(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
    scaling: float | None = None, dropout: float = 0.0, **_: Any,
) -> tuple[Tensor, Tensor]:
    """GPT-2's `_upcast_and_reordered_attn` with a free `scaling`: fp32 softmax(QKᵀ·scaling + mask)V.

    q: [B, H, T, D], k, v: [B, H, S, D] → ([B, T, H, D], probs [B, H, T, S] in v's dtype). The same operations
    in the same order as the stock method (autocast off, baddbmm with alpha = scaling), so scaling =
    module.scaling reproduces the stock eager model bit for bit; dropout p as the interface passes it.
    """
    batch, heads, length, dim = query.shape
    keys = key.shape[-2]
    scaling = dim**-0.5 if scaling is None else scaling
    scores = torch.empty(batch * heads, length, keys, dtype=torch.float32, device=query.device)
    with maybe_autocast(query.device.type, enabled=False):  # no-op unless autocast is on
        q, k = query.reshape(-1, length, dim), key.transpose(-1, -2).reshape(-1, dim, keys)
        scores = torch.baddbmm(scores, q.float(), k.float(), beta=0, alpha=scaling).reshape(batch, heads, length, keys)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1).type(value.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2), probs


def _make_smoothed(backend: str) -> Callable[..., tuple[Tensor, Tensor | None]]:
    """A wrapper of the stock `backend` that tempers modules carrying TAU_ATTR; q, k, v: [B, H, T, D]."""

    def smoothed_attention(
        module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
        *args: Any, **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        """ASU (arXiv 2603.01285), softmax(QKᵀ/(τ√d))V; returns ([B, T, H, D], probs [B, H, T, S] or None)."""
        if backend != "eager":
            base = ALL_ATTENTION_FUNCTIONS[backend]
        else:  # stock eager upcasts GPT-2-style modules to fp32 (module doc)
            base = _upcast_eager if _wants_upcast(module) else _eager_function(type(module))
        tau = getattr(module, TAU_ATTR, 1.0)
        if tau != 1.0:
            if args:  # positional extras could be `scaling` (eager and sdpa order them differently)
                raise SmoothingError(
                    f"{type(module).__name__} passes attention arguments positionally; cannot find `scaling`."
                )
            kwargs = _tempered_kwargs(kwargs, tau, query.shape[-1])
        output, weights = base(module, query, key, value, attention_mask, *args, **kwargs)
        probe = getattr(module, PROBE_ATTR, None)
        if probe is not None and weights is not None:
            probe.append(torch.special.entr(weights.detach().float()).sum(-1))  # [B, H, T] nats
        return output, weights

    smoothed_attention.__name__ = f"{PREFIX}{backend}"
    return smoothed_attention


def _register_backends() -> None:
    """Register `obliviate_<backend>` with both the attention and the mask interface (idempotent)."""
    for backend in SUPPORTED_BACKENDS:
        name = PREFIX + backend
        if name not in ALL_ATTENTION_FUNCTIONS:
            AttentionInterface.register(name, _make_smoothed(backend))
        # Without a mask entry, 5.24 silently builds no mask (eager turns bidirectional, sdpa ignores padding).
        if name not in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[backend])


# Registered at import so that a deep-copied or unpickled smoothed model still finds its backend.
_register_backends()


# ----------------------------------------------------------------------------- model inspection


@functools.cache
def _routes_through_interface(cls: type) -> bool:
    """Whether `cls.forward` dispatches through ALL_ATTENTION_FUNCTIONS (else τ would be silently ignored)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in source


# Code that picks a path by the backend's NAME would take another path under `obliviate_<backend>`:
# the sparse-indexer models (DeepSeek-V3.2, GLM-MoE-DSA, Mistral-Large-4, ...) build their top-k mask
# only when the name is literally "eager" or "sdpa", so smoothing would silently drop that mask.
_NAME_BRANCH = re.compile(r"_attn_implementation\s+(?:not\s+)?in\s+\(\s*[\"'](?:eager|sdpa)[\"']")


@functools.cache
def branches_on_backend_name(module_name: str) -> bool:
    """Whether the modeling module `module_name` tests `_attn_implementation in ("eager", "sdpa")`."""
    mod = sys.modules.get(module_name)
    try:
        source = inspect.getsource(mod) if mod is not None else ""
    except (OSError, TypeError):
        return False
    return bool(_NAME_BRANCH.search(source))


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """The self-attention modules of `model` (class name ending in 'Attention' with an int layer_idx)."""
    name = type(model).__name__
    found = [
        m for m in model.modules()
        if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int)
    ]
    if not found:
        raise SmoothingError(
            f"{name}: found no attention module with a `layer_idx`; attention smoothing supports models whose "
            f"attention calls transformers' AttentionInterface (Llama, Mistral, Qwen2/3, Gemma, GPT-2, ...)."
        )
    for cls in {type(m) for m in found}:
        if branches_on_backend_name(cls.__module__):
            raise SmoothingError(
                f"{name}: {cls.__module__} chooses code paths by the attention backend's name (e.g. its sparse "
                f"top-k mask is built only for 'eager'/'sdpa'), so a smoothed backend would silently change the "
                f"model beyond the temperature; smoothing does not support this architecture yet."
            )
        if not _routes_through_interface(cls):
            raise SmoothingError(
                f"{name}: {cls.__name__} computes attention itself instead of calling transformers' "
                f"AttentionInterface, so a temperature cannot be applied; supported are models that use the "
                f"interface (Llama, Mistral, Qwen2/3, Gemma, GPT-2, ...)."
            )
    return found


def _current_implementation(model: nn.Module) -> str:
    """`config._attn_implementation` of `model` ('eager' when unset, as the interface then falls back to it)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if not isinstance(implementation, str):
        raise SmoothingError(f"{type(model).__name__}: per-sub-model attention implementations are not supported.")
    return implementation


def _stock_backend(model: nn.Module) -> str:
    """The stock backend the model runs (or ran before smoothing); SmoothingError if it cannot be wrapped."""
    backend = _current_implementation(model).removeprefix(PREFIX)
    if backend not in SUPPORTED_BACKENDS:
        raise SmoothingError(
            f"{type(model).__name__}: attention backend {backend!r} cannot be smoothed (supported: "
            f"{', '.join(SUPPORTED_BACKENDS)}). Flash-attention backends and Hub kernels pick their kernel by the "
            f"configured name; call model.set_attn_implementation('sdpa') first."
        )
    return backend


def _num_layers(model: nn.Module, modules: list[nn.Module]) -> int:
    """Number of decoder layers, for Python-style negative indices."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text_config, "num_hidden_layers", None)
    return count if isinstance(count, int) else 1 + max(m.layer_idx for m in modules)


def _as_index(value: Any) -> int:
    """An int layer index (numpy/torch integers accepted; bools and floats are ValueError)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise SmoothingValueError(f"layer indices must be ints, got {value!r}.")


def _resolve_layers(layers: Sequence[int] | None, available: set[int], num_layers: int) -> set[int]:
    """Layer indices (negative allowed, like Python) → non-negative indices of attention layers."""
    if layers is None:
        return set(available)
    if isinstance(layers, (int, str)) or len(layers) == 0:
        raise SmoothingValueError(f"layers must be a non-empty sequence of ints or None (all layers), got {layers!r}.")
    resolved = set()
    for layer in map(_as_index, layers):
        index = layer + num_layers if layer < 0 else layer
        if not 0 <= index < num_layers:
            raise SmoothingValueError(f"layer index {layer} is out of range for a model with {num_layers} layers.")
        if index not in available:
            raise SmoothingValueError(f"layer {layer} has no softmax attention module (attention layers: {sorted(available)}).")
        resolved.add(index)
    return resolved


def _check_tau(tau: float) -> float:
    """τ must be a finite number > 0 (τ > 1 smooths, τ = 1 is the stock model, τ < 1 sharpens); modeling.teacher."""
    problem = tau_problem(tau)
    if problem:
        raise SmoothingValueError(f"tau must be {problem}, got {tau!r}.")
    return float(tau)


def _set_implementation(model: nn.Module, implementation: str) -> None:
    """Point the model's attention dispatch at `implementation` (no-op if already there)."""
    if _current_implementation(model) != implementation:
        model.set_attn_implementation(implementation)


# ----------------------------------------------------------------------------- public API


def smooth_attention(model: nn.Module, tau: float, layers: Sequence[int] | None = None) -> nn.Module:
    """ASU (arXiv 2603.01285), softmax(QKᵀ/(τ√d))V on `layers` (None = all), in place; replaces any earlier τ."""
    tau = _check_tau(tau)
    modules = _attention_modules(model)
    backend = _stock_backend(model)
    chosen = _resolve_layers(layers, {m.layer_idx for m in modules}, _num_layers(model, modules))
    for module in modules:
        if module.layer_idx in chosen:
            setattr(module, TAU_ATTR, tau)
        elif hasattr(module, TAU_ATTR):
            delattr(module, TAU_ATTR)
    _set_implementation(model, PREFIX + backend)
    return model


def remove_smoothing(model: nn.Module) -> nn.Module:
    """Undo `smooth_attention`: stock backend and scaling, bit-identical to the unsmoothed model."""
    for module in model.modules():
        if hasattr(module, TAU_ATTR):
            delattr(module, TAU_ATTR)
    implementation = _current_implementation(model)
    if implementation.startswith(PREFIX):
        _set_implementation(model, implementation.removeprefix(PREFIX))
    return model


def is_smoothed(model: nn.Module) -> bool:
    """Whether the model currently dispatches attention through an obliviate wrapper."""
    return _current_implementation(model).startswith(PREFIX)


def smoothed_teacher(model: nn.Module, tau: float, layers: Sequence[int] | None = None) -> nn.Module:
    """Frozen eval-mode deep copy with ASU (arXiv 2603.01285) softmax(QKᵀ/(τ√d))V; the source is untouched."""
    # Validate on the source first so a bad argument fails before the (large) copy is made.
    _check_tau(tau)
    modules = _attention_modules(model)
    _resolve_layers(layers, {m.layer_idx for m in modules}, _num_layers(model, modules))
    _stock_backend(model)
    teacher = copy.deepcopy(model)
    teacher.eval()
    teacher.requires_grad_(False)
    return smooth_attention(teacher, tau, layers)


def smoothing_info(model: nn.Module) -> dict[str, Any]:
    """For logs: {'backend', 'implementation', 'smoothed', 'tau': {layer: τ}} (τ = 1.0 on untouched layers)."""
    modules = _attention_modules(model)
    taus = {m.layer_idx: float(getattr(m, TAU_ATTR, 1.0)) for m in modules}
    implementation = _current_implementation(model)
    return {
        "backend": implementation.removeprefix(PREFIX),
        "implementation": implementation,
        "smoothed": implementation.startswith(PREFIX) and any(t != 1.0 for t in taus.values()),
        "tau": dict(sorted(taus.items())),
    }


@contextmanager
def _probing(modules: list[nn.Module]) -> Iterator[None]:
    """Attach an entropy list to each attention module for one forward; always detach it."""
    try:
        for module in modules:
            setattr(module, PROBE_ATTR, [])
        yield
    finally:
        for module in modules:
            if hasattr(module, PROBE_ATTR):
                delattr(module, PROBE_ATTR)


@contextmanager
def _temporarily(model: nn.Module, implementation: str) -> Iterator[None]:
    """Run with `implementation` and eval mode, then restore the previous backend and train/eval flags."""
    previous = _current_implementation(model)
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()  # attention dropout would perturb the probabilities
        _set_implementation(model, implementation)
        yield
    finally:
        _set_implementation(model, previous)
        for module, training in modes:
            module.training = training


def _masked_mean(entropy: Tensor, valid: Tensor) -> Tensor:
    """Mean over valid queries: entropy [B, H, T], valid [B, T] bool → [H]."""
    weights = valid[:, None, :].to(entropy.dtype)
    return (entropy * weights).sum(dim=(0, 2)) / weights.sum(dim=(0, 2)).clamp_min(1.0)


def attention_entropy(model: nn.Module, batch: dict[str, Tensor], *, per_head: bool = False) -> Tensor:
    """Mean entropy (nats) of attention rows at non-pad queries, ASU (arXiv 2603.01285): [L] or [L, H]."""
    modules = sorted(_attention_modules(model), key=lambda m: m.layer_idx)
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention_mask = None if batch.get("attention_mask") is None else batch["attention_mask"].to(device)
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    # The eager wrapper returns probabilities and honours the τ already set on the modules.
    with _probing(modules), _temporarily(model, PREFIX + "eager"), torch.no_grad():
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        probes = [getattr(m, PROBE_ATTR) for m in modules]
    # Modules never called (e.g. an unused wrapper class) have empty probes; no call at all means no routing.
    rows = [_masked_mean(probe[0], valid) for probe in probes if probe]
    if not rows:
        raise SmoothingError(f"{type(model).__name__}: no attention call reached the interface; no entropy to measure.")
    per_layer_head = torch.stack([row.cpu() for row in rows])  # [L, H]
    return per_layer_head if per_head else per_layer_head.mean(dim=1)
