"""The configs of the commands: unlearn (RunConfig), finetune, eval, calibrate, and the sections only they use."""
from __future__ import annotations

from dataclasses import dataclass

from obliviate.config.audit import AuditConfig
from obliviate.config.fields import require, section, setting
from obliviate.config.sections import (
    ContinualConfig,
    DataConfig,
    EvalConfig,
    HubConfig,
    MethodConfig,
    ModelConfig,
    MuseEvalConfig,
    TrainConfig,
    check_data_fields,
    check_layer_list,
)


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig = section(ModelConfig(), "starting model")
    data: DataConfig = section(DataConfig(), "forget / retain data")
    method: MethodConfig = section(MethodConfig(), "forget objective + retain term")
    train: TrainConfig = section(TrainConfig(), "optimisation")
    eval: EvalConfig = section(EvalConfig(), "TOFU-style evaluation after training (data.format qa)")
    muse: MuseEvalConfig = section(MuseEvalConfig(), "MUSE evaluation after training (data.format text; "
                                                     "skipped when muse.source is empty)")
    continual: ContinualConfig = section(ContinualConfig(), "continual unlearning: the forget split as a sequence "
                                                            "of requests (docs/METHODS.md §1.5)")
    audit: AuditConfig = section(AuditConfig(), "attack the saved model after the run (obliviate audit; data.format "
                                                "qa): audit.enabled=true writes output_dir/audit and the verdict "
                                                "into receipt.json")
    hub: HubConfig = section(HubConfig(), "share the saved model on the Hugging Face Hub after the run "
                                          "(hub.push=true, hub.repo_id=owner/name; as `obliviate push`)")
    output_dir: str = setting("", "where the model, tokenizer, resolved config and metrics are written")
    overwrite: bool = setting(False, "replace an existing output_dir (otherwise it is an error)")


@dataclass(frozen=True)
class TinyConfig:
    hidden_size: int = setting(128, "model width")
    layers: int = setting(2, "transformer layers")
    heads: int = setting(4, "attention heads")
    vocab_size: int = setting(1024, "BPE vocabulary trained on the data's text")
    seed: int = setting(0, "initialisation seed")

    def __post_init__(self) -> None:
        require(self.hidden_size >= 8 and self.hidden_size % self.heads == 0, "tiny.hidden_size",
                 self.hidden_size, "a multiple of tiny.heads and >= 8")
        require(self.layers >= 1, "tiny.layers", self.layers, ">= 1")
        require(self.vocab_size >= 300, "tiny.vocab_size", self.vocab_size, ">= 300 (byte alphabet + merges)")


@dataclass(frozen=True)
class FinetuneDataConfig:
    source: str = setting("", "directory of <split>.jsonl files, a file, or a hub dataset id")
    splits: list = setting(["full"], "splits to train on together, e.g. [retain90, real_authors, world_facts]")
    max_length: int = setting(256, "max tokens per example")
    format: str = setting("qa", "qa (question/answer rows) | text (raw documents, chunked into max_length windows)")
    fields: dict = setting({}, "the data's own column names for obliviate's fields (qa), e.g. "
                               "{question: prompt, answer: response}")

    def __post_init__(self) -> None:
        check_data_fields(self.fields, self.format)


@dataclass(frozen=True)
class KnowsConfig:
    split: str | None = setting(None, "a QA split of data.source (e.g. forget10) whose questions the model answers "
                                      "greedily after every epoch: the ROUGE-L recall (and fact recall where rows "
                                      "annotate facts) per epoch, and the first epoch both reach `bar`")
    bar: float = setting(0.8, "the recall that counts as knowing the split (TOFU-style targets: 0.8)")
    every_steps: int | None = setting(None, "check every N optimizer steps instead of once per epoch (and always at "
                                            "the last step)")
    max_examples: int | None = setting(None, "first N rows of the split (null: all)")
    max_new_tokens: int = setting(200, "greedy answer length (TOFU: 200)")
    batch_size: int = setting(32, "rows generated together")

    def __post_init__(self) -> None:
        require(0.0 < self.bar <= 1.0, "knows.bar", self.bar, "in (0, 1]")
        require(self.every_steps is None or self.every_steps >= 1, "knows.every_steps", self.every_steps,
                ">= 1 or null")
        require(self.max_examples is None or self.max_examples >= 1, "knows.max_examples", self.max_examples,
                ">= 1 or null")
        require(self.max_new_tokens >= 1, "knows.max_new_tokens", self.max_new_tokens, ">= 1")
        require(self.batch_size >= 1, "knows.batch_size", self.batch_size, ">= 1")


@dataclass(frozen=True)
class FinetuneConfig:
    model: ModelConfig = section(ModelConfig(), "model to start from; path 'tiny' builds a small Llama + BPE tokenizer from the data")
    tiny: TinyConfig = section(TinyConfig(), "size of the model built when model.path is 'tiny'")
    data: FinetuneDataConfig = section(FinetuneDataConfig(), "training data")
    train: TrainConfig = section(TrainConfig(epochs=10, lr=1e-4), "optimisation")
    knows: KnowsConfig = section(KnowsConfig(), "how many epochs until the model knows a split (knows.split)")
    output_dir: str = setting("", "where the model, tokenizer, resolved config and metrics are written")
    overwrite: bool = setting(False, "replace an existing output_dir")


@dataclass(frozen=True)
class McqEvalConfig:
    source: str = setting("", "JSONL/JSON file (question, choices, answer) or hub id, e.g. cais/wmdp")
    config: str | None = setting(None, "hub config, e.g. wmdp-bio, wmdp-cyber, all (MMLU)")
    split: str = setting("test", "hub split")
    name: str | None = setting(None, "dataset name for the metric key (default: config or file name)")
    target: str = setting("letter", "score ' A'..' D' after the lettered prompt (letter) or each choice's text (text)")
    batch_size: int = setting(32, "evaluation batch size (generation rows; answers scored per forward)")
    max_length: int = setting(1024, "max tokens per prompt + option (prompts are cut from the left)")
    max_examples: int | None = setting(None, "first N questions")
    lm_eval_tasks: list = setting([], "lm-evaluation-harness tasks to run as well, e.g. [wmdp_bio, mmlu] (extra: lm-eval)")
    lm_eval_limit: int | None = setting(None, "lm-eval's limit per task")
    lm_eval_num_fewshot: int | None = setting(None, "lm-eval's few-shot examples per question (SAGO reports 5-shot "
                                                    "MMLU); null: each task's own default (0 for wmdp and mmlu)")
    lm_eval_batch_size: int = setting(8, "lm-eval's batch size")
    lm_eval_include_path: str | None = setting(None, "a folder of your own lm-eval task YAML files (tasks it defines "
                                                     "can be named in lm_eval_tasks)")

    def __post_init__(self) -> None:
        require(self.target in ("letter", "text"), "mcq.target", self.target, "letter or text")
        require(self.lm_eval_num_fewshot is None or self.lm_eval_num_fewshot >= 0, "mcq.lm_eval_num_fewshot",
                self.lm_eval_num_fewshot, ">= 0 or null")
        require(self.lm_eval_batch_size >= 1, "mcq.lm_eval_batch_size", self.lm_eval_batch_size, ">= 1")
        require(self.lm_eval_limit is None or self.lm_eval_limit >= 1, "mcq.lm_eval_limit", self.lm_eval_limit,
                ">= 1 or null")


@dataclass(frozen=True)
class RwkuEvalConfig:
    source: str = setting("jinzhuoran/RWKU", "RWKU directory of <level>.json files, a file, or the hub id")
    levels: list = setting(["forget_level1", "forget_level2", "forget_level3", "neighbor_level1", "neighbor_level2"],
                      "probe levels to evaluate")
    subject: str | None = setting(None, "the unlearning target (RWKU evaluates one subject at a time)")
    max_new_tokens: int = setting(30, "answer length")
    batch_size: int = setting(32, "evaluation batch size (generation rows; answers scored per forward)")
    max_examples: int | None = setting(None, "first N probes per level")




@dataclass(frozen=True)
class EvalRunConfig:
    benchmark: str = setting("tofu", "tofu | muse | mcq | rwku")
    model: ModelConfig = section(ModelConfig(), "model to evaluate")
    eval: EvalConfig = section(EvalConfig(), "TOFU: splits (eval.source is required) and settings")
    muse: MuseEvalConfig = section(MuseEvalConfig(), "MUSE settings")
    mcq: McqEvalConfig = section(McqEvalConfig(), "multiple choice (WMDP / MMLU) settings")
    rwku: RwkuEvalConfig = section(RwkuEvalConfig(), "RWKU settings")
    sections: dict = setting({}, "settings of benchmarks that bring their own settings class (plugins), by section "
                                 "name, e.g. {toxicity: {threshold: 0.5}}; checked against that class")
    max_length: int = setting(256, "max tokens per example for likelihoods")
    output_dir: str = setting("", "where metrics.json and report.md are written")
    overwrite: bool = setting(False, "replace an existing output_dir")

    def __post_init__(self) -> None:  # the name is checked against eval/benchmarks.py's registry by the pre-flight
        require(isinstance(self.benchmark, str) and bool(self.benchmark), "benchmark", self.benchmark,
                "a benchmark name (obliviate eval --help lists them)")


@dataclass(frozen=True)
class CalibrateConfig:
    model: ModelConfig = section(ModelConfig(), "the model to unlearn (θ0); its smoothed copy is the teacher")
    source: str = setting("", "data directory / file / hub id of the forget set")
    split: str = setting("forget10", "the forget split to calibrate on")
    max_examples: int | None = setting(200, "use the first N rows (null: all)")
    taus: list = setting([1.5, 2.0, 3.0, 4.0, 8.0, 16.0], "temperatures to try")
    layer_sets: list | None = setting(None, "layer sets to try, e.g. [[0], [0, 1], null]; null = a default sweep")
    functional_budget: float = setting(0.7, "max mean log-prob loss (nats) of functional tokens for a setting to count")
    min_factual: float = setting(0.3, "factual tokens must lose at least this many nats to be recommended by selectivity")
    max_length: int = setting(256, "max tokens per example")
    window_widths: list | None = setting(None, "the teacher map's layer axis: contiguous windows of these widths at "
                                               "window_starts start layers spread across the depth, e.g. [1, 3, 10] "
                                               "(instead of layer_sets)")
    window_starts: int = setting(5, "start layers per window width, spread evenly from the first layer to the last")
    replies: bool = setting(False, "the teacher map: each setting's greedy replies on the forget rows (and "
                                   "retain_split's): recall, degenerate share, and whether facts drop while "
                                   "fluency holds")
    retain_split: str | None = setting(None, "rows to check the teacher's replies on beside the forget rows")
    retain_examples: int = setting(32, "use the first N retain rows")
    max_new_tokens: int = setting(32, "reply length of the teacher map's greedy replies")
    recall_ratio: float = setting(0.5, "fluent forgetting: the teacher recalls at most this share of θ0's forget "
                                       "recall ...")
    degenerate_max: float = setting(0.2, "... and at most this share of its forget replies is degenerate")
    output_dir: str = setting("", "where calibration.json and calibration.md are written (optional)")
    overwrite: bool = setting(False, "replace an existing output_dir")

    def __post_init__(self) -> None:
        require(bool(self.taus) and all(isinstance(t, (int, float)) and t > 0 for t in self.taus),
                 "taus", self.taus, "a non-empty list of positive numbers")
        require(self.window_widths is None or self.layer_sets is None, "window_widths", self.window_widths,
                "null when layer_sets is given (one layer axis: explicit sets or windows)")
        require(self.window_widths is None or (isinstance(self.window_widths, list) and bool(self.window_widths) and all(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in self.window_widths)),
            "window_widths", self.window_widths, "null or a non-empty list of widths >= 1, e.g. [1, 3, 10]")
        require(self.window_starts >= 1, "window_starts", self.window_starts, ">= 1")
        require(self.retain_examples >= 1, "retain_examples", self.retain_examples, ">= 1")
        require(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        require(0 < self.recall_ratio <= 1, "recall_ratio", self.recall_ratio, "in (0, 1]")
        require(0 <= self.degenerate_max < 1, "degenerate_max", self.degenerate_max, "in [0, 1)")
        require(self.replies or self.retain_split is None, "retain_split", self.retain_split,
                "null unless replies=true (the retain rows are only read for the teacher's replies)")
        require(self.functional_budget > 0, "functional_budget", self.functional_budget, "> 0")
        require(self.layer_sets is None or bool(self.layer_sets), "layer_sets", self.layer_sets,
                 "null (a default sweep) or a non-empty list of layer sets such as [[0], [0, 1], null]")
        for i, layers in enumerate(self.layer_sets or []):
            check_layer_list(layers, f"layer_sets[{i}]")
