"""The synthetic world and its two models (the offline demo's and the sweeps' demo track): the config, the checks
before training, and the retain and target models built once and kept.

The retain model (trained without the forget authors) is trained first; the target continues from it on the full
split, so both share everything but the forget authors and one long training run makes both.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from obliviate.config import EvalConfig, MethodConfig, TinyConfig, TrainConfig, build, section, to_dict
from obliviate.config.fields import require, setting
from obliviate.data.synthetic import corpus_texts, make_world, write_world
from obliviate.files import check_output_dir
from obliviate.modeling.sources import check_layer_indices, check_model_source

# torch and everything built on it are imported inside the functions that train, so that the CLI checks a config
# (unknown keys, bad values) without loading them.


@dataclass(frozen=True)
class WorldConfig:
    authors: int = setting(20, "fictitious authors in the full split")
    forget_percent: int = setting(10, "share of authors to forget (a whole number of authors)")
    pretrain_authors: int = setting(0, "other authors added to both models' training data (fluency)")
    seed: int = setting(0, "world seed")

    def __post_init__(self) -> None:
        require(self.authors >= 2, "world.authors", self.authors, ">= 2")
        require(0 < self.forget_percent < 100, "world.forget_percent", self.forget_percent, "in (0, 100)")


@dataclass(frozen=True)
class DemoConfig:
    world: WorldConfig = section(WorldConfig(), "the synthetic world")
    tiny: TinyConfig = section(TinyConfig(), "the from-scratch model")
    base_model: str | None = setting(None, "a pretrained model (directory, hub id, .gguf or alias such as "
                                      "smollm2-135m-instruct) fine-tuned on the world instead of a tiny model "
                                      "trained from scratch (full fine-tuning)")
    max_length: int = setting(96, "max tokens per example")
    retain_train: TrainConfig = section(TrainConfig(epochs=25, batch_size=16, lr=3e-3, warmup_ratio=0.05,
                                                    weight_decay=0.0), "training of the retain model")
    target_train: TrainConfig = section(TrainConfig(epochs=10, batch_size=16, lr=1e-3, warmup_ratio=0.05,
                                                    weight_decay=0.0), "target = retain model trained on full")
    unlearn: TrainConfig = section(TrainConfig(epochs=20, batch_size=8, lr=1e-3, scheduler="constant",
                                               weight_decay=0.0), "unlearning runs (the same budget for every method)")
    methods: dict = setting({"ASU_KL": {"forget": "asu", "forget_args": {"tau": 16.0, "layers": [0]}, "retain": "kl"},
                        "GradDiff": {"forget": "ga", "retain": "nll"}},
                       "name -> method section (forget, retain, combine, ...), each unlearned from the target")
    eval: EvalConfig = section(EvalConfig(max_new_tokens=200, batch_size=32), "evaluation of every model")
    output_dir: str = setting("obliviate-demo", "results directory")
    overwrite: bool = setting(False, "replace an existing output_dir")
    audit: bool = setting(True, "attack every unlearned model afterwards (obliviate audit: relearning, quantisation, "
                           "paraphrases, MIA; the target is the 100% reference, the retain model the 0% one) and "
                           "write audit/<method>/")
    threads: int = setting(2, "torch threads for the whole demo, fixed so that float rounding (and so every printed "
                         "digit) does not depend on the machine's core count; 0 = torch's default")
    cpu_kernels: str = setting("avx2", "x86-64 CPU kernels: avx2 (every machine prints the same digits; pinned before torch "
                                  "loads, i.e. when run as `obliviate demo`) or native (this CPU's best, e.g. AVX-512)")

    def __post_init__(self) -> None:
        require(self.threads >= 0, "threads", self.threads, ">= 0 (0 = torch's default)")
        require(self.cpu_kernels in ("avx2", "native"), "cpu_kernels", self.cpu_kernels, "avx2 or native")
        require(bool(self.methods), "methods", self.methods, "a non-empty mapping of name -> method section")
        reserved = {"retain", "target"} & set(self.methods)
        require(not reserved, "methods", sorted(reserved), "named other than 'retain' and 'target'")
        methods = self.method_configs()  # every method section is checked now, with its key in the message
        if not self.base_model:  # the tiny model's depth is known now: ASU's layers must exist in it
            for name, method in methods.items():
                if isinstance(method.forget_args.get("layers"), list):
                    check_layer_indices(method.forget_args["layers"], self.tiny.layers,
                                        f"methods.{name}.forget_args.layers")

    def method_configs(self) -> dict[str, MethodConfig]:
        """The `methods` mapping as validated MethodConfigs."""
        return {str(name): build(MethodConfig, raw, f"methods.{name}.") for name, raw in self.methods.items()}


def preflight_demo(cfg: DemoConfig, *, need_output: bool = True) -> list[str]:
    """Checks of `obliviate demo` before anything trains (also `obliviate validate`): the output directory, the
    base model's files, every method's objective, rule and hyper-parameters; lines for `validate`."""
    from obliviate.train.unlearn import resolve_method

    if need_output or cfg.output_dir:
        check_output_dir(cfg.output_dir, cfg.overwrite)
    lines = [f"world: {cfg.world.authors} authors, forget {cfg.world.forget_percent}%, seed {cfg.world.seed}"]
    if cfg.base_model:
        lines.append("base model: " + check_model_source(cfg.base_model, "base_model"))
    else:
        lines.append(f"model: a tiny Llama trained here ({cfg.tiny.layers} layers, hidden {cfg.tiny.hidden_size})")
    for name, method in cfg.method_configs().items():
        rm = resolve_method(method)  # unknown objectives, rules and hyper-parameters
        lines.append(f"method {name}: {method.forget} + {method.retain or 'no retain term'}, rule {rm.rule.name}")
    return lines


def eval_config(cfg: DemoConfig) -> EvalConfig:
    """The demo's evaluation: the world's forget{p}_perturbed and holdout{p} splits."""
    p = cfg.world.forget_percent
    return EvalConfig(**{**to_dict(cfg.eval), "forget_split": f"forget{p:02d}_perturbed", "holdout_split": f"holdout{p:02d}"})


# What a machine without AVX-512 runs, forced on every x86-64 machine so that the demo's digits agree across them:
# torch's own vectorised kernels, MKL's BLAS (its conditional numerical reproducibility branch) and oneDNN.
AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"}


def pin_cpu_kernels() -> bool:
    """Pin the CPU kernels to AVX2 for this process (variables already set by the user are kept); only effective
    before torch loads, so `obliviate demo` calls it first. True when the pin can take effect."""
    import os
    import platform
    import sys

    if "torch" in sys.modules or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    for key, value in AVX2_KERNELS.items():
        os.environ.setdefault(key, value)
    return True


def cpu_kernels() -> str:
    """The instruction set torch's CPU kernels run with, and MKL's reproducibility branch (recorded with the digits)."""
    import os

    import torch

    return f"{torch.backends.cpu.get_cpu_capability()} (MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')})"


def train_models(cfg: DemoConfig, world: Any, log: Any) -> tuple[Any, Any, Any]:
    """(tokenizer, target, retain model): the retain model is trained on the retain split, then the target
    continues from it on the full split (module docstring); a base model replaces the tiny one."""
    from obliviate.modeling.frozen import frozen_copy
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer
    from obliviate.train.unlearn import finetune

    p = cfg.world.forget_percent
    general = world.splits["real_authors"] + world.splits["world_facts"] + world.splits["pretrain"]
    if cfg.base_model:
        from obliviate.modeling.load import load_pretrained

        model, tok = load_pretrained(cfg.base_model)
    else:
        tok = train_tokenizer(corpus_texts(world), vocab_size=cfg.tiny.vocab_size)
        model = tiny_llama(tok, hidden_size=cfg.tiny.hidden_size, num_layers=cfg.tiny.layers,
                           num_heads=cfg.tiny.heads, seed=cfg.tiny.seed)
    log(f"world: {cfg.world.authors} authors ({len(world.splits['full'])} QA), forget{p:02d} = "
        f"{len(world.splits[f'forget{p:02d}'])} QA; model: {sum(x.numel() for x in model.parameters()):,} parameters")
    ml = cfg.max_length
    finetune(model, tok, world.splits[f"retain{100 - p:02d}"] + general, cfg.retain_train, max_length=ml,
             desc="retain model")
    retain_model = frozen_copy(model)
    finetune(model, tok, world.splits["full"] + general, cfg.target_train, max_length=ml, desc="target model")
    return tok, model, retain_model


def _model_settings(cfg: DemoConfig) -> dict[str, Any]:
    """What the world and its two models depend on (a saved pair is reused only for the same settings)."""
    keys = ("world", "tiny", "base_model", "max_length", "retain_train", "target_train", "threads", "cpu_kernels")
    return {k: v for k, v in to_dict(cfg).items() if k in keys}


def world_models(cfg: DemoConfig, directory: Path, log: Any = print) -> tuple[Any, Path, Any, Any, Any]:
    """(world, world directory, tokenizer, target, retain model) of a demo config, built once and kept in
    `directory` (world/, target/, retain/, settings.json): a later call with the same settings loads them."""
    import json

    import torch

    from obliviate.modeling.load import atomic_dir, load_pretrained, save_model

    settings = _model_settings(cfg)
    world = make_world(cfg.world.authors, seed=cfg.world.seed, n_pretrain=cfg.world.pretrain_authors,
                       forget_percents=(cfg.world.forget_percent,))
    marker = directory / "settings.json"
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == json.loads(json.dumps(settings)):
        target, tok = load_pretrained(str(directory / "target"))
        retain_model, _ = load_pretrained(str(directory / "retain"))
        log(f"  reused the world and its models in {directory}")
        return world, directory / "world", tok, target.eval(), retain_model.eval()
    with threads(cfg.threads):
        torch.manual_seed(cfg.world.seed)
        tok, target, retain_model = train_models(cfg, world, log)
    with atomic_dir(directory, overwrite=True) as out:
        write_world(world, out / "world")
        save_model(out / "target", target, tok)
        save_model(out / "retain", retain_model, tok)
        (out / "settings.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
    return world, directory / "world", tok, target.eval(), retain_model.eval()


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's thread count set to `n` (0: left as it is) inside the block, restored after it."""
    import torch

    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

