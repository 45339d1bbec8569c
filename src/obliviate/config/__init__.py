"""Run configuration: frozen dataclasses with help text, loaded from YAML with `a.b=v` overrides.

Unknown keys, wrong types and impossible values are ConfigErrors that name the key and the fix.
The package face only: `sections.py` (a run's sections: model, data, method, train, eval, ...), `commands.py`
(each command's config: RunConfig, FinetuneConfig, EvalRunConfig, CalibrateConfig, ...), `loader.py` (YAML,
overrides, types, to_dict, describe), `fields.py` (setting, section, require), `audit.py` (the audit's settings).
"""
from __future__ import annotations

from obliviate.config.audit import AuditConfig
from obliviate.config.commands import (
    CalibrateConfig,
    EvalRunConfig,
    FinetuneConfig,
    FinetuneDataConfig,
    McqEvalConfig,
    RunConfig,
    RwkuEvalConfig,
    TinyConfig,
)
from obliviate.config.fields import need, require, section, setting
from obliviate.config.loader import (
    apply_overrides,
    build,
    describe,
    load_config,
    parse_override,
    read_yaml,
    to_dict,
)
from obliviate.config.sections import (
    OPTIMIZERS,
    TRACKERS,
    ChatSettings,
    CombineConfig,
    ContinualConfig,
    DataConfig,
    EvalConfig,
    HubConfig,
    LoraSettings,
    MethodConfig,
    ModelConfig,
    MuseEvalConfig,
    TrainConfig,
    check_data_fields,
    check_layer_list,
    method_label,
)

__all__ = [
    "AuditConfig",
    "need",
    "require",
    "section",
    "setting",
    "LoraSettings",
    "ChatSettings",
    "ModelConfig",
    "OPTIMIZERS",
    "DataConfig",
    "check_data_fields",
    "CombineConfig",
    "MethodConfig",
    "method_label",
    "TRACKERS",
    "check_layer_list",
    "TrainConfig",
    "EvalConfig",
    "MuseEvalConfig",
    "ContinualConfig",
    "HubConfig",
    "RunConfig",
    "TinyConfig",
    "FinetuneDataConfig",
    "FinetuneConfig",
    "McqEvalConfig",
    "RwkuEvalConfig",
    "EvalRunConfig",
    "CalibrateConfig",
    "build",
    "parse_override",
    "apply_overrides",
    "read_yaml",
    "load_config",
    "to_dict",
    "describe",
]
