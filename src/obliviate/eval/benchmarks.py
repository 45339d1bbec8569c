"""The benchmarks `obliviate eval` runs, by name: one registry from which the command's choices, its dispatch, its
pre-flight (the paths a benchmark reads and the models it loads) and `validate` derive.

A benchmark is a `BenchmarkSpec`: the section of the eval config that holds its settings, the setting keys that are
paths it reads and models it loads, and its steps named as "module:function" strings, imported only when they run
(lm-evaluation-harness's habit for its tasks), so that `obliviate eval --help` and `validate`'s early checks import no
torch. No torch here.

    preflight(cfg)                      -> (state, lines)   before any model loads: checks, and what `run` reuses
    run(model, tokenizer, cfg, state)   -> metrics           the metrics dict written to metrics.json

Adding a benchmark: its functions, its metric table (eval.metrics.register in the module that computes them), and one
`register_benchmark` here or in a plugin. Its settings are either a section of EvalRunConfig (the built-in ones) or a
dataclass it names itself (`settings_class`, a plugin's), which users fill under `sections.<section>` of the eval
config and which is checked like any other section (unknown keys and wrong types are errors naming the key).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable

from obliviate.config import EvalRunConfig, build
from obliviate.registry import Registry


@dataclass(frozen=True)
class BenchmarkSpec:
    """One evaluation benchmark and what the command needs to know about it."""

    name: str
    section: str  # the EvalRunConfig attribute holding its settings ("eval" for TOFU), or its key under `sections`
    run: str  # "module:function"(model, tokenizer, cfg, state) -> the metrics dict
    preflight: str | None = None  # "module:function"(cfg) -> (state, lines for validate); None: nothing to check
    inputs: tuple[str, ...] = ("source",)  # keys of its section that are paths (or hub ids) it reads
    models: tuple[str, ...] = ()  # keys of its section that are model sources it loads (checked before loading)
    help: str = ""
    settings_class: str | None = None  # "module:Class", a config dataclass: settings read from `sections.<section>`

    def settings(self, cfg: Any) -> Any:
        """The benchmark's settings section of an eval config (built and checked from `sections.<section>` when the
        benchmark brings its own settings class)."""
        if self.settings_class is None:
            return getattr(cfg, self.section)

        return build(resolve(self.settings_class), cfg.sections.get(self.section) or {}, f"sections.{self.section}.")

    def input_paths(self, cfg: Any) -> dict[str, Any]:
        """{section.key: value} of every path it reads (None where unset)."""
        section = self.settings(cfg)
        return {f"{self.section}.{k}": getattr(section, k) for k in (*self.inputs, *self.models)}


BENCHMARKS: Registry[BenchmarkSpec] = Registry("benchmark")


def register_benchmark(spec: BenchmarkSpec) -> BenchmarkSpec:
    """Register `spec` under its name (unique, lowercase); returns it. A benchmark without a settings class must name
    one of EvalRunConfig's sections."""
    if spec.settings_class is None:
        import dataclasses
        import typing

        own = sorted(k for k, tp in typing.get_type_hints(EvalRunConfig).items()
                     if dataclasses.is_dataclass(tp) and k != "model")
        if spec.section not in own:
            raise ValueError(f"benchmark {spec.name!r}: section {spec.section!r} is not one of the eval config's "
                             f"sections {own}; give the benchmark its own settings_class='module:Class'")
    return BENCHMARKS.add(spec.name, spec)


def own_sections() -> dict[str, str]:
    """{section: benchmark name} of the registered benchmarks that bring their own settings class (`sections.*`)."""
    return {BENCHMARKS.get(n).section: n for n in BENCHMARKS.names() if BENCHMARKS.get(n).settings_class}


def resolve(ref: str) -> Callable[..., Any]:
    """The function a "module:function" string names, imported now."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


register_benchmark(BenchmarkSpec(
    "tofu", "eval", run="obliviate.eval.runner:run_tofu", preflight="obliviate.eval.runner:preflight_tofu",
    inputs=("source", "retain_reference"), models=("retain_model",),
    help="TOFU: forget quality, model utility, truth ratios, ROUGE, MIAs (eval.*)"))
register_benchmark(BenchmarkSpec(
    "muse", "muse", run="obliviate.eval.runner:run_muse", models=("retrain_model",),
    help="MUSE: VerbMem, KnowMem, PrivLeak (muse.*)"))
register_benchmark(BenchmarkSpec(
    "mcq", "mcq", run="obliviate.eval.runner:run_mcq", help="WMDP / MMLU multiple choice, native or lm-eval (mcq.*)"))
register_benchmark(BenchmarkSpec(
    "rwku", "rwku", run="obliviate.eval.runner:run_rwku", help="RWKU forget and neighbour probes (rwku.*)"))
