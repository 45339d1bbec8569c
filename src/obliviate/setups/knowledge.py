"""A pretrained model's known facts (the real-model demo's and the sweeps' knowledge track): the config, the probe
of every fact with θ0's greedy replies, the known ones grouped (forget, neighbours, retain, held out), and the checks
made before the model loads. torch is imported only where a model runs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obliviate.config import MethodConfig, ModelConfig, TrainConfig, build, section
from obliviate.config.fields import require, setting
from obliviate.data.rows import load_split, write_jsonl
from obliviate.errors import ConfigError
from obliviate.eval.generate import generate_answers
from obliviate.eval.knowledge import (
    FAMILY_OF_TOFU,
    Fact,
    KnowledgeSplit,
    facts_from_rows,
    first_per_family,
    load_facts,
    split_known,
    unique_questions,
)
from obliviate.files import check_output_dir
from obliviate.modeling.sources import check_model_source, layer_count, model_config
from obliviate.modeling.teacher import Teacher
from obliviate.preflight import check_method_layers
from obliviate.train.unlearn import resolve_method

AUTO = "auto"  # forget_args tau value: take τ and layers from the calibration sweep


@dataclass(frozen=True)
class KnowledgeSettings:
    facts: str | None = setting(None, "facts file (JSONL: id, family, entity, question, answer, aliases); null: the built-in set")
    tofu_source: str | None = setting(None, "TOFU directory or hub id whose world_facts / real_authors are probed too (null: none)")
    tofu_splits: list = setting(["world_facts", "real_authors"], "TOFU splits added to the probe")
    forget_families: list = setting(["capitals"], "fact families to forget (see the probe table)")
    forget_entities: list = setting([], "entities to forget instead (every family's facts about them)")
    max_forget: int | None = setting(None, "at most this many forget facts (the first known ones)")
    max_per_family: int | None = setting(None, "probe only the first N facts of each family (null: all; a quick look)")
    retain_share: float = setting(0.5, "share of the remaining known facts the retain term trains on (rest: held out)")
    max_eval: int | None = setting(20, "evaluate at most N facts of neighbours / retain / held-out (forget: all)")
    max_new_tokens: int = setting(24, "greedy reply length for probing and evaluation")
    batch_size: int = setting(32, "generation / scoring batch size")
    other_mcq: bool = setting(True, "the 4-way probe on the known non-forget facts too (other_mcq_accuracy: 4 scored "
                              "sentences per fact, about a third of an evaluation); false: the forget facts' probe only")

    def __post_init__(self) -> None:
        require(0 < self.retain_share <= 1, "knowledge.retain_share", self.retain_share, "in (0, 1]")
        require(self.max_new_tokens >= 1, "knowledge.max_new_tokens", self.max_new_tokens, ">= 1")
        require(self.max_forget is None or self.max_forget >= 1, "knowledge.max_forget", self.max_forget, ">= 1 or null")
        require(self.max_per_family is None or self.max_per_family >= 1, "knowledge.max_per_family",
                 self.max_per_family, ">= 1 or null")


@dataclass(frozen=True)
class CalibrateSettings:
    taus: list = setting([2.0, 3.0, 4.0], "temperatures tried for `tau: auto` methods")
    layer_sets: list | None = setting(None, "layer sets tried (null: obliviate.eval.analysis.default_layer_sets)")
    functional_budget: float = setting(0.7, "max mean log-prob loss of functional tokens (nats)")
    min_factual: float = setting(0.3, "factual tokens must lose at least this much to be chosen by selectivity")


@dataclass(frozen=True)
class KnowledgeDemoConfig:
    kind: str = setting("knowledge", "demo kind: knowledge (a pretrained model forgets facts it knows)")
    model: ModelConfig = section(ModelConfig(path="smollm2-135m-instruct"), "the pretrained model θ0")
    knowledge: KnowledgeSettings = section(KnowledgeSettings(), "facts, groups and probing")
    max_length: int = setting(96, "max tokens per training example")
    unlearn: TrainConfig = section(TrainConfig(epochs=3, batch_size=8, lr=2e-5, scheduler="constant", weight_decay=0.0),
                                   "unlearning runs (the same budget for every method)")
    methods: dict = setting({"ASU_KL": {"forget": "asu", "forget_args": {"tau": 2.0, "layers": None}, "retain": "kl"},
                        "GradDiff": {"forget": "ga", "retain": "nll"}},
                       "name -> method section, each unlearned from θ0; forget_args {tau: auto} uses the calibration")
    calibrate: CalibrateSettings = section(CalibrateSettings(), "the τ/layer sweep behind `tau: auto`")
    seed: int = setting(0, "seed of the retain/held-out split and the MCQ options")
    audit: bool = setting(False, "attack every unlearned model afterwards (obliviate audit: relearning, NF4/FP4/GGUF/RTN, few-shot "
                            "and completion prompts, MIA forget vs held-out facts; θ0 = 100%, the unlearned model "
                            "before the attack = 0%)")
    output_dir: str = setting("obliviate-demo-real", "results directory")
    overwrite: bool = setting(False, "replace an existing output_dir")

    def __post_init__(self) -> None:
        require(self.kind == "knowledge", "kind", self.kind, "knowledge")
        require(bool(self.methods), "methods", self.methods, "a non-empty mapping of name -> method section")
        require(not {"original"} & set(self.methods), "methods", sorted(self.methods), "named other than 'original'")
        self.method_configs(Teacher().as_args())  # every section checked now, with its key in the message

    def method_configs(self, auto: dict[str, Any]) -> dict[str, MethodConfig]:
        """The methods as validated MethodConfigs, `tau: auto` replaced by `auto` (τ and layers)."""
        out = {}
        for name, raw in self.methods.items():
            raw = dict(raw)
            args = dict(raw.get("forget_args") or {})
            require(not isinstance(args.get("tau"), str) or args["tau"] == AUTO, f"methods.{name}.forget_args.tau",
                     args.get("tau"), f"a number > 1 or {AUTO!r} (the calibration's choice)")
            if args.get("tau") == AUTO:
                raw["forget_args"] = {**args, **auto}
            out[str(name)] = build(MethodConfig, raw, f"methods.{name}.")
        return out

    def needs_calibration(self) -> bool:
        return any((m.get("forget_args") or {}).get("tau") == AUTO for m in self.methods.values())


def probe_facts(cfg: KnowledgeSettings) -> list[Fact]:
    """The built-in (or given) facts plus the configured TOFU splits."""
    facts = load_facts(cfg.facts)
    if cfg.tofu_source:
        for split in cfg.tofu_splits:
            facts += facts_from_rows(load_split(cfg.tofu_source, str(split)), FAMILY_OF_TOFU.get(str(split), str(split)))
    return first_per_family(unique_questions(facts), cfg.max_per_family)


def probe_and_split(model: Any, tok: Any, facts: list[Fact], cfg: KnowledgeDemoConfig) -> tuple[list[str], KnowledgeSplit]:
    """θ0's greedy replies to every fact, and the known facts grouped (forget, neighbours, retain, held out)."""

    kc = cfg.knowledge
    replies = generate_answers(model, tok, [f.question for f in facts], max_new_tokens=kc.max_new_tokens,
                               batch_size=kc.batch_size, desc=f"probing {len(facts)} facts")
    split = split_known(facts, replies, forget_families=kc.forget_families, forget_entities=kc.forget_entities,
                        retain_share=kc.retain_share, max_forget=kc.max_forget, seed=cfg.seed)
    return replies, split


def write_groups(directory: Path, split: KnowledgeSplit) -> None:
    """The groups' training rows as <group>.jsonl (so `obliviate calibrate source=DIR split=forget` works)."""

    directory.mkdir(parents=True, exist_ok=True)
    for name in split.groups():
        write_jsonl(directory / f"{name}.jsonl", split.train_rows(name))


def _checked_facts(cfg: KnowledgeDemoConfig) -> list[Fact]:
    """The facts to probe; unknown families and bad methods fail here, before the model loads."""

    facts = probe_facts(cfg.knowledge)
    families = sorted({f.family for f in facts})
    unknown = sorted(set(cfg.knowledge.forget_families) - set(families))
    if unknown:
        raise ConfigError(f"knowledge.forget_families: unknown families {unknown}; valid: {families}")
    for method in cfg.method_configs(Teacher().as_args()).values():
        resolve_method(method)  # unknown objectives, rules and hyper-parameters
    return facts


def preflight_knowledge(cfg: KnowledgeDemoConfig, *, need_output: bool = True) -> tuple[list[Fact], list[str]]:
    """Checks of the real-model demo before the model loads (also `obliviate validate`): the output directory,
    the facts and TOFU splits, the forget families, every method, the model source; (the facts, lines for
    `validate`)."""

    if need_output or cfg.output_dir:
        check_output_dir(cfg.output_dir, cfg.overwrite)
    facts = _checked_facts(cfg)
    model_line = "model: " + check_model_source(cfg.model.path, "model.path")
    n_layers = layer_count(model_config(cfg.model.path))
    if n_layers is not None:  # every method's layers exist in the model (the GGUF header counts them too)
        for name, method in cfg.method_configs(Teacher().as_args()).items():
            try:
                check_method_layers(method, resolve_method(method), n_layers)
            except ConfigError as exc:
                raise ConfigError(f"methods.{name}: {exc}") from None
        model_line += f", {n_layers} layers"
    lines = [f"facts: {len(facts)} to probe in {len({f.family for f in facts})} families; forget "
             f"{', '.join(map(str, cfg.knowledge.forget_families)) or 'entities ' + str(cfg.knowledge.forget_entities)}",
             model_line,
             "methods: " + ", ".join(cfg.methods) + (" (tau: auto is calibrated first)" if cfg.needs_calibration()
                                                     else "")]
    return facts, lines

