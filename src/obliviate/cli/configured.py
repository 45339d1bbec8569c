"""What the commands configured by a YAML recipe share: `--config FILE key=value ...`, `--show-config`,
`--help-config`, which config class a command (or a file given to `validate`) resolves to, and quieter libraries.

Only the demos' modules import torch, and only for `demo`: every other command reads its config (and reports a missing
file or an unknown key) without loading torch.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Sequence

import yaml

from obliviate import config
from obliviate.cli.ls import objective_keys
from obliviate.setups.world import DemoConfig
from obliviate.sweep.config import SweepConfig, anchored


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of every configured command."""
    p.add_argument("--config", help="YAML recipe (see configs/); optional for demo")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.lr=1e-5")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")


def config_class(command: str, config_file: str | None = None) -> type:
    """The config dataclass of a command; for `demo`, the YAML's `kind: knowledge` picks the real-model demo.

    Only the demos' modules import torch, and only for `demo`: every other command reads its config (and
    reports a missing file or an unknown key) without loading torch."""
    if command == "demo":
        kind = config.read_yaml(config_file).get("kind") if config_file else None
        if kind == "knowledge":
            from obliviate.setups.knowledge import KnowledgeDemoConfig

            return KnowledgeDemoConfig
        return DemoConfig
    if command == "sweep":
        return SweepConfig
    return {"finetune": config.FinetuneConfig, "unlearn": config.RunConfig, "eval": config.EvalRunConfig,
            "calibrate": config.CalibrateConfig, "validate": config.RunConfig}[command]


VALIDATE_AS = ("unlearn", "demo", "finetune", "eval", "calibrate", "sweep")  # in this order when a config's keys fit several

def validate_class(config_file: str | None, overrides: Sequence[str], as_command: str | None) -> type:
    """The config class `obliviate validate` checks a file against: `--as COMMAND`, else the command whose config
    has every top-level key of the file and the overrides (a file that fits none gets the closest one, whose
    error then names the unknown keys)."""
    if as_command:
        return config_class(as_command, config_file)
    data = config.read_yaml(config_file) if config_file else {}
    if "kind" in data:  # only the demos have a kind
        return config_class("demo", config_file)
    keys = set(data) | {o.split("=", 1)[0].split(".")[0] for o in overrides if "=" in o}

    def unknown(command: str) -> int:
        cls = config_class(command, config_file)
        return len(keys - {f.name for f in dataclasses.fields(cls)}) + _unknown_nested(data, cls)

    return config_class(min(VALIDATE_AS, key=lambda c: (unknown(c), VALIDATE_AS.index(c))), config_file)


def _unknown_nested(raw: Any, cls: type) -> int:
    """How many keys inside the known sections of a config file `cls` lacks (e.g. data.splits is finetune's, not
    unlearn's): what tells two commands apart whose top-level sections are the same."""
    if not isinstance(raw, dict):
        return 0
    count = 0
    for f in dataclasses.fields(cls):
        if f.name not in raw or not isinstance(raw[f.name], dict):
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(default):
            section = type(default)
            names = {g.name for g in dataclasses.fields(section)}
            count += len(set(raw[f.name]) - names) + _unknown_nested(raw[f.name], section)
    return count


def command_class(args: argparse.Namespace) -> type:
    """The config class the parsed command line resolves to (`validate` finds it from the file)."""
    if args.command == "validate":
        return validate_class(args.config, list(args.overrides), args.as_command)
    return config_class(args.command, args.config)


def quiet_libraries() -> None:
    """Hide transformers' per-file progress bars and info logs: our own progress bar says what runs."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def resolve(args: argparse.Namespace, extra: Sequence[str] = ()) -> Any | None:
    """The command's config from --config, `extra` overrides (e.g. eval's shortcuts) and the command line's; None
    after --help-config or --show-config printed what they print."""
    if args.help_config:
        cls = command_class(args)
        rows = config.describe(cls)
        if cls is config.RunConfig:  # each objective's own keys, under method.forget_args / method.retain_args
            rows += objective_keys()
        for key, default, text in rows:
            print(f"{key:<36} {default!r:<24} {text}")
        return None
    cfg = config.load_config(command_class(args), args.config, list(extra) + list(args.overrides))

    if isinstance(cfg, SweepConfig) and args.config:  # its base and teacher maps, from the sweep file's folder up
        cfg = anchored(cfg, args.config)
    if args.show_config:
        print(yaml.safe_dump(config.to_dict(cfg), sort_keys=False))
        return None
    return cfg


def run_with(work: Callable[[Any], Any], args: argparse.Namespace, extra: Sequence[str] = (),
             quiet: bool = True) -> int:
    """A configured command's `run`: resolve its config (`extra` overrides first), then, unless --help-config or
    --show-config answered, quiet the libraries (not for commands that load no weights) and do `work(cfg)`."""
    cfg = resolve(args, extra)
    if cfg is not None:
        if quiet:
            quiet_libraries()
        work(cfg)
    return 0
