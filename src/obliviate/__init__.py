"""obliviate: make a causal LM forget chosen data, and prove it.

The Python API, loaded on first use (`import obliviate` imports no torch):

    load_config(RunConfig, path, overrides)      a run's config from YAML and key=value overrides
    run_unlearn(cfg)                             what `obliviate unlearn` does: pre-flight, unlearn, evaluate, save
    load_model(ModelConfig(path=...))            (model, tokenizer), a local folder, a GGUF file or a hub id
    rows_from([{"question": ..., "answer": ...}]) QA rows from in-memory records
    unlearn(model, tokenizer, forget, retain, MethodConfig(...), TrainConfig(...))
                                                 the unlearning loop on a model in memory (the model is changed)
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {  # name -> module that defines it
    "load_config": "obliviate.config", "RunConfig": "obliviate.config", "MethodConfig": "obliviate.config",
    "TrainConfig": "obliviate.config", "ModelConfig": "obliviate.config", "EvalRunConfig": "obliviate.config",
    "run_unlearn": "obliviate.cli.unlearn", "run_eval": "obliviate.cli.eval", "load_model": "obliviate.train.student",
    "rows_from": "obliviate.data.rows", "QARow": "obliviate.data.rows", "unlearn": "obliviate.train.unlearn",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """An API name, imported from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'obliviate' has no attribute {name!r}; the API: {', '.join(__all__)}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
