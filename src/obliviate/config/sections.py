"""The sections of a run's config: model, data, method, train, eval, continual, hub (frozen dataclasses with
help text; impossible values are ConfigErrors naming the key and the fix)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from obliviate.catalogue import builtin_needs
from obliviate.columns import check_fields
from obliviate.config.fields import require, section, setting
from obliviate.errors import ConfigError
from obliviate.hub import is_owner_name
from obliviate.modeling.chat import check_format
from obliviate.modeling.teacher import check_teacher_args


@dataclass(frozen=True)
class LoraSettings:
    enabled: bool = setting(False, "train LoRA adapters only; θ0 = the same network with adapters off (no copy)")
    r: int = setting(8, "adapter rank")
    alpha: int = setting(16, "LoRA alpha (scaling alpha / r)")
    dropout: float = setting(0.0, "dropout on the adapter input")
    target_modules: list | None = setting(None, "module names to adapt (null: every linear layer but the head)")
    merge_on_save: bool = setting(True, "save the merged model (loadable without peft) instead of the adapters")


@dataclass(frozen=True)
class ChatSettings:
    system: str | None = setting(None, "system turn before each question (chat templates only); null: none. "
                                       "open-unlearning's TOFU models: 'You are a helpful assistant.'")
    template_args: dict = setting({}, "keyword arguments for the chat template, e.g. {date_string: '10 Apr 2025'}; "
                                      "a template that reads today's date always gets a fixed one (docs/METRICS.md §1.1)")
    prompt_template: str | None = setting(None, "a raw prompt for models fine-tuned without a chat template, with one "
                                          "{question} field, e.g. '[INST] {question} [/INST]' (TOFU's Llama-2 "
                                          "models, closer-look, ASU): the answer follows it directly, prompt + answer "
                                          "tokenised together as those references do, EOS last; replaces the tokenizer's chat template (not with system / "
                                          "template_args); null: the chat template, else 'Question: ...\\nAnswer:'")

    def __post_init__(self) -> None:
        try:
            check_format(self.system, self.template_args, prompt_template=self.prompt_template)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def given(self) -> bool:
        """Whether the config sets a prompt format (else a saved model's own chat_format.json applies)."""
        return self.system is not None or bool(self.template_args) or self.prompt_template is not None


@dataclass(frozen=True)
class ModelConfig:
    path: str = setting("", "local directory or hub id of a causal LM (safetensors); the starting model θ0")
    tokenizer: str | None = setting(None, "tokenizer path or hub id when it differs from `path`")
    dtype: str = setting("float32", "float32 | bfloat16 | float16")
    attn_implementation: str = setting("sdpa", "eager | sdpa | any backend transformers knows")
    trust_remote_code: bool = setting(False, "allow custom model code from the hub (off unless you trust it)")
    lora: LoraSettings = section(LoraSettings(), "parameter-efficient unlearning with LoRA adapters")
    chat: ChatSettings = section(ChatSettings(), "how the chat template is called: system turn, template arguments")
    load_in_4bit: bool = setting(False, "QLoRA: the base weights loaded in 4-bit NF4 (bitsandbytes, double quantised, "
                                        "bf16 compute; CUDA only) under trainable LoRA adapters; θ0 = the adapters off. "
                                        "Needs model.lora.enabled=true and model.lora.merge_on_save=false (the "
                                        "adapters are saved alone)")

    def __post_init__(self) -> None:
        dtypes = ("float32", "bfloat16", "float16")  # obliviate.modeling.load.DTYPES
        require(self.dtype in dtypes, "model.dtype", self.dtype, f"one of {', '.join(dtypes)}")
        if self.load_in_4bit:
            require(self.lora.enabled, "model.lora.enabled", self.lora.enabled,
                    "true with model.load_in_4bit=true (QLoRA trains adapters over the frozen 4-bit base)")
            require(not self.lora.merge_on_save, "model.lora.merge_on_save", self.lora.merge_on_save,
                    "false with model.load_in_4bit=true (a 4-bit base cannot take the adapters exactly; they are "
                    "saved alone, to merge into the full-precision base later)")


OPTIMIZERS = ("adamw", "adamw_8bit", "paged_adamw", "paged_adamw_8bit")  # train/optim.py builds them


@dataclass(frozen=True)
class DataConfig:
    source: str = setting("", "directory of <split>.jsonl files (TOFU layout), a file, or a hub dataset id")
    forget_split: str = setting("forget10", "the data to forget")
    retain_split: str = setting("retain90", "data to keep (must not share questions with the forget split)")
    max_length: int = setting(256, "max tokens per example; the prompt is kept, the answer cut at the right")
    format: str = setting("qa", "qa (question/answer rows) | text (raw documents, chunked into max_length windows)")
    fields: dict = setting({}, "the data's own column names for obliviate's fields (qa), e.g. "
                               "{question: prompt, answer: response}; unset fields keep their names")
    windows: str = setting("document", "how raw text (format text) is cut: document = each document [BOS] + its "
                                       "tokens in max_length windows, short tails dropped | stream = as "
                                       "open-unlearning's PretrainingDataset (SAGO's WMDP / RWKU runs): documents + "
                                       "'\\n\\n' as one token stream, max_length windows, BOS on every window, "
                                       "the stream's tail dropped (data/text.py)")

    def __post_init__(self) -> None:
        require(self.max_length >= 8, "data.max_length", self.max_length, ">= 8")
        require(self.format in ("qa", "text"), "data.format", self.format, "qa or text")
        require(self.windows in ("document", "stream"), "data.windows", self.windows, "document or stream")
        require(self.windows == "document" or self.format == "text", "data.windows", self.windows,
                "document for QA data (data.format=qa): windows cut raw text only")
        check_data_fields(self.fields, self.format)


def check_data_fields(fields: Any, fmt: str, key: str = "data.fields") -> None:
    """data.fields: a valid column mapping, for QA data only (raw text reads each row's "text")."""
    try:
        check_fields(fields, key)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if fields and fmt != "qa":
        raise ConfigError(f"{key} maps QA columns, but data.format is {fmt!r}; drop {key} (raw text reads 'text')")


@dataclass(frozen=True)
class CombineConfig:
    rule: str = setting("sum", "gradient rule: sum | sago | sago_retain | pcgrad | pcgrad_global | blur | gru | gru_ema")
    separate_backward: bool | None = setting(None, "forget and retain backward separately (always for rules "
                                              "other than sum; null = only when the rule needs it)")
    module_stats: bool = setting(False, "log gradient-geometry statistics per parameter tensor too")
    args: dict = setting({}, "the rule's own settings, defaults filled in (obliviate ls), e.g. {gru_gamma: 0.9} for "
                             "gru: the weight of the current retain gradient in its EMA (the authors': 0.8, 0.9, 0.95)")

    def __post_init__(self) -> None:
        require(isinstance(self.args, dict), "method.combine.args", self.args, "a mapping, e.g. {gru_gamma: 0.9}")


@dataclass(frozen=True)
class MethodConfig:
    forget: str = setting("asu", "forget objective (obliviate ls)")
    forget_args: dict = setting({}, "hyper-parameters of the forget objective, e.g. {tau: 3.0, layers: [0]}")
    retain: str | None = setting("kl", "retain term (nll | kl | ...); null for none")
    retain_args: dict = setting({}, "hyper-parameters of the retain term")
    gamma: float = setting(1.0, "forget weight γ")
    alpha: float = setting(1.0, "retain weight α")
    refusals: str | None = setting(None, "file of refusal answers for idk/dpo/ap (null: the shipped TOFU list)")
    refusal_draw: str = setting("per_access", "per_access: a fresh refusal each time a question is used, seeded by "
                                              "(seed, step) as open-unlearning draws them | per_example: one refusal "
                                              "per question for the whole run (closer-look seeds it by the index)")
    allow_unusual_tau: bool = setting(False, "run ASU with forget_args.tau <= 1 anyway: tau = 1 makes the teacher the "
                                        "model itself (ASU then does nothing), tau < 1 sharpens its attention "
                                        "instead of smoothing it; both are refused unless this is true")
    combine: CombineConfig = section(CombineConfig(), "how forget and retain gradients combine (docs/METHODS.md §2)")
    cache: str = setting("auto", "θ0 stats (teacher/reference) cached per example after their first forward, for the "
                            "rows the run will use: auto = summed log-probs always (npo/dpo), vocabulary "
                            "distributions exactly (θ0's hidden states when train.vocab_chunk applies), in memory "
                            "under cache_max_gb, else on disk (cache_spill) or live | exact (refuse over the "
                            "limit) | topk (top-k + tail bucket; asu/kl only) | none (live frozen forwards every "
                            "step)")
    cache_topk: int = setting(64, "k of method.cache=topk: exact top-k log-probs + the log of the remaining mass")
    cache_max_gb: float = setting(4.0, "limit on the θ0 cache (all roles; estimate printed before it is filled)")
    cache_bf16: bool = setting(False, "store cached distributions in bfloat16 (half the memory; log-probs rounded to "
                                 "a relative 2^-9)")
    cache_spill: bool = setting(True, "method.cache=auto over cache_max_gb: keep the largest caches on disk, "
                                      "memory-mapped (false: compute them live every step instead)")
    cache_dir: str | None = setting(None, "where spilled caches live (a fresh folder inside it, removed after the "
                                          "run); null: the system's temporary directory")

    def __post_init__(self) -> None:
        require(self.gamma >= 0, "method.gamma", self.gamma, ">= 0")
        require(self.alpha >= 0, "method.alpha", self.alpha, ">= 0")
        require(self.refusal_draw in ("per_access", "per_example"), "method.refusal_draw", self.refusal_draw,
                "per_access or per_example")
        if "teacher" in builtin_needs("forget").get(self.forget, ()):  # ASU's checks for ASU only (a plugin's: at
            check_teacher_args(self.forget_args, self.allow_unusual_tau)  # resolve_method, as every objective's)

    @property
    def label(self) -> str:
        """The run's name in tables and reports: forget+retain(+rule), e.g. npo+nll+sago."""
        return method_label(self.forget, self.retain, self.combine.rule)


def method_label(forget: Any, retain: Any, rule: Any = "sum") -> str:
    """forget+retain+rule (retain left out when null, rule when it is the plain sum): ga+nll, npo+nll+sago."""
    return "+".join(str(x) for x in (forget, retain, None if rule in (None, "sum") else rule) if x)


TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")  # train.report_to: accelerate's tracker names


def check_layer_list(value: Any, key: str) -> None:
    """null (every layer) or a non-empty list of int layer indices; the range needs the model (obliviate.preflight)."""
    ok = value is None or (isinstance(value, list) and bool(value)
                           and all(isinstance(i, int) and not isinstance(i, bool) for i in value))
    require(ok, key, value, "null (every layer) or a non-empty list of layer indices such as [0] or [0, 1] "
                             "(negative indices count from the last layer)")


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = setting(5.0, "passes over the forget (or fine-tune) set")
    max_steps: int | None = setting(None, "optimizer steps; overrides epochs when set")
    batch_size: int = setting(8, "examples per device per micro-batch (forget and retain each)")
    grad_accum: int = setting(1, "micro-batches per optimizer step")
    lr: float = setting(1e-5, "peak learning rate (AdamW)")
    weight_decay: float = setting(0.01, "AdamW weight decay")
    scheduler: str = setting("linear", "linear | cosine | constant | constant_with_warmup (transformers)")
    warmup_ratio: float = setting(0.0, "share of steps used for linear warm-up")
    warmup_epochs: float | None = setting(None, "warm-up given in epochs instead: floor(warmup_epochs × forget rows "
                                          "/ (batch_size × processes × grad_accum)) steps, as the ASU authors' "
                                          "forget.py sets one epoch's steps (not with warmup_ratio); null: "
                                          "warmup_ratio")
    max_grad_norm: float | None = setting(1.0, "gradient clipping norm; null to disable")
    seed: int = setting(0, "seed for initialisation order, shuffling and forget/retain pairing")
    deterministic: bool = setting(False, "bitwise-repeatable training on a GPU: torch's deterministic algorithms "
                                  "(warning where an op has none) and cuBLAS's fixed workspace; slower. A model "
                                  "fine-tuned again on another machine of the same kind then has the same weights, "
                                  "so a study can go on there (sweeps check θ0's weight digest)")
    cpu: bool = setting(False, "force the CPU even when a GPU is present")
    progress: bool = setting(True, "show a rich progress bar")
    checkpoint_dir: str | None = setting(None, "directory for checkpoints; a run with one resumes from it")
    checkpoint_every: int = setting(0, "save a checkpoint every N optimizer steps (0 = never)")
    resume: str = setting("auto", "a checkpoint in checkpoint_dir: auto = resume it when it was written by this same run "
                             "(settings, model, data; else an error listing what differs) | never = start fresh "
                             "(the old one is replaced when the first new one is written) | require = resume, "
                             "error if there is none")
    fsdp: bool = setting(False, "shard the student and its frozen θ0 copy with torch FSDP2 (per decoder layer, then the "
                           "root) over the launched processes (torchrun), for models that do not fit one device; "
                           "AdamW state is sharded too, the trained model is gathered in full at the end")
    group_by_length: bool = setting(True, "within each optimizer step, sort its examples by length before cutting them into "
                                     "accumulation micro-batches (less padding; the step's examples and gradient are "
                                     "unchanged)")
    precision: str = setting("fp32", "fp32 | bf16: bf16 autocast of the forward passes; weights, gradients, AdamW state, "
                                "log-softmax, KL and reductions stay float32 (train/switches.py)")
    gradient_checkpointing: bool = setting(False, "recompute each decoder layer's activations in the backward (less "
                                             "memory, ~1/3 more compute, same math)")
    optimizer: str = setting("adamw", "adamw (torch) | adamw_8bit | paged_adamw | paged_adamw_8bit: bitsandbytes' "
                                      "AdamW with 8-bit states and/or states paged to CPU memory under GPU memory "
                                      "pressure (CUDA only; pip install bitsandbytes)")
    vocab_chunk: int | str = setting("auto", "answer rows whose logits exist at once: the LM head and every "
                                     "vocabulary-sized loss (log-softmax, NLL, KL, entropy) run this many rows at a "
                                     "time and are recomputed in the backward, so no [tokens, vocab] tensor of the "
                                     "batch exists (same values and gradients); 0: all rows at once; auto: "
                                     "2^23 / vocab rows from a 65,536 vocabulary on (Llama-3, Qwen, Gemma), else 0 (modeling/logprobs.py)")
    share_prefix: bool = setting(True, "run the leading tokens that every row of a batch shares (a chat template's "
                                 "system turn) once, and the rest of each row on their KV cache: same math to float "
                                 "rounding; off by itself under torchrun, gradient checkpointing and compile "
                                 "(modeling/prefix.py)")
    compile: bool = setting(False, "torch.compile each decoder layer of the student (same math; pays compile time first)")
    compile_backend: str = setting("inductor", "torch.compile backend for train.compile (inductor | aot_eager | ...)")
    report_to: str | list = setting("none", "experiment trackers that get every optimizer step's history entry (its "
                                     "metrics.json values) through accelerate: none | tensorboard | wandb | mlflow | "
                                     "trackio, or a list of them; wandb, mlflow and trackio need their package "
                                     "(pip install wandb)")
    tracking_dir: str | None = setting(None, "where the trackers write (TensorBoard's event files, wandb's local files), "
                                       "in a sub-directory per run (run_name), so runs can share it; null: "
                                       "<output_dir>/logs for unlearn and finetune (.<output_dir name>.logs beside "
                                       "it while training, moved in with the run), ./logs/<run_name> when the "
                                       "library is called directly")
    tracking_project: str = setting("obliviate", "the trackers' project: wandb / trackio project, MLflow experiment, "
                                                 "TensorBoard's sub-directory of tracking_dir")
    run_name: str | None = setting(None, "the run's name in the trackers; null: output_dir's last part (the method "
                                         "label when there is none)")

    def __post_init__(self) -> None:
        require(self.precision in ("fp32", "bf16"), "train.precision", self.precision, "fp32 or bf16")
        require(self.optimizer in OPTIMIZERS, "train.optimizer", self.optimizer, f"one of {', '.join(OPTIMIZERS)}")
        require(self.optimizer == "adamw" or not self.fsdp, "train.optimizer", self.optimizer,
                "adamw with train.fsdp (bitsandbytes' optimizers do not take FSDP's sharded parameters)")
        require(self.vocab_chunk == "auto" or (isinstance(self.vocab_chunk, int) and not isinstance(self.vocab_chunk, bool)
                                               and self.vocab_chunk >= 0),
                "train.vocab_chunk", self.vocab_chunk, "auto, 0 (off) or a number of rows >= 1")
        require(self.checkpoint_every >= 0, "train.checkpoint_every", self.checkpoint_every, ">= 0")
        require(not self.checkpoint_every or bool(self.checkpoint_dir), "train.checkpoint_every",
                 self.checkpoint_every, "0 unless train.checkpoint_dir is set")
        require(self.epochs > 0, "train.epochs", self.epochs, "> 0")
        require(self.max_steps is None or self.max_steps >= 1, "train.max_steps", self.max_steps, ">= 1 or null")
        require(self.batch_size >= 1, "train.batch_size", self.batch_size, ">= 1")
        require(self.grad_accum >= 1, "train.grad_accum", self.grad_accum, ">= 1")
        require(self.lr > 0, "train.lr", self.lr, "> 0")
        require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, ">= 0")
        require(0 <= self.warmup_ratio < 1, "train.warmup_ratio", self.warmup_ratio, "in [0, 1)")
        if self.warmup_epochs is not None:
            require(self.warmup_epochs >= 0, "train.warmup_epochs", self.warmup_epochs, ">= 0 or null")
            require(self.warmup_ratio == 0, "train.warmup_ratio", self.warmup_ratio,
                    "0 when train.warmup_epochs is set (give the warm-up one way)")
            require(self.max_steps is not None or self.warmup_epochs < self.epochs, "train.warmup_epochs",
                    self.warmup_epochs, f"below train.epochs ({self.epochs}): the warm-up must end inside the run")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, "train.max_grad_norm", self.max_grad_norm, "> 0 or null")
        schedulers = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial")
        require(self.scheduler in schedulers, "train.scheduler", self.scheduler, f"one of {', '.join(schedulers)}")
        require(self.resume in ("auto", "never", "require"), "train.resume", self.resume, "auto, never or require")
        _ = self.trackers  # an unknown tracker name is a ConfigError listing the known ones

    @property
    def trackers(self) -> tuple[str, ...]:
        """The trackers train.report_to names (none: an empty tuple), in its order, each once."""
        names = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        names = [] if names == ["none"] else names
        for name in names:
            require(name in TRACKERS, "train.report_to", self.report_to,
                    f"none or one or a list of {', '.join(TRACKERS)}")
        return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class EvalConfig:
    enabled: bool = setting(True, "evaluate after training")
    source: str | None = setting(None, "evaluation data directory / hub id (defaults to data.source)")
    forget_split: str | None = setting("forget10_perturbed", "forget split with paraphrased/perturbed answers")
    retain_split: str | None = setting("retain_perturbed", "retain split with paraphrased/perturbed answers")
    real_authors_split: str | None = setting("real_authors_perturbed", "real-authors split (3 perturbed answers)")
    world_facts_split: str | None = setting("world_facts_perturbed", "world-facts split (3 perturbed answers)")
    retain_model: str | None = setting(None, "model trained without the forget set (for forget_quality)")
    retain_reference: str | None = setting(None, "open-unlearning's evaluation log of a retain model (its "
                                           "TOFU_EVAL.json): forget_quality from the per-row forget truth ratios "
                                           "it holds and privleak's reference AUC from its mia_min_k, as that "
                                           "framework reads them, without the retain model (not with "
                                           "eval.retain_model)")
    max_new_tokens: int = setting(200, "greedy generation length (TOFU: 200)")
    batch_size: int | str = setting("auto", "evaluation batch size: auto (generation: as many rows as the KV cache "
                                    "budget holds, at most 512, finished rows leaving the batch; scoring: 2,048 "
                                    "padded answer tokens per forward on a CPU, 16,384 on an accelerator) or a "
                                    "number of rows for both")
    max_examples: int | None = setting(None, "evaluate only the first N rows of each split (quick looks)")
    memorization: bool = setting(True, "forget extraction strength and exact memorisation (one forward, no generation)")
    holdout_split: str | None = setting(None, "never-trained rows (e.g. holdout01): PrivLeak and MIA AUCs, forget vs holdout")
    closer_look: bool = setting(False, "FE/MU of the closer-look protocol (needs the embedding and NLI models)")
    embedding_model: str | None = setting("sentence-transformers/paraphrase-MiniLM-L6-v2",
                                     "sentence-embedding model (hub id or local path) for Cosine Similarity")
    nli_model: str | None = setting("sileod/deberta-v3-base-tasksource-nli", "NLI model (hub id or local path) for "
                                                                        "the Entailment Score")
    protocol: str = setting("tofu", "tofu: every row, max_new_tokens new tokens per answer | closer_look: as the "
                               "closer-look authors run it (sail-sg/closer-look-LLM-unlearning config/tofu.yaml: "
                               "ds_size 300, generation max_length 200): the first 300 rows of each split (fewer "
                               "with max_examples), at most 200 tokens of prompt + answer per generation (and per "
                               "scored sequence), and FE/MU on (as closer_look=true)")
    token_rule: str = setting("open_unlearning", "tokens of extraction strength, exact memorisation, Min-K% and Min-K%++ "
                                            "| open_unlearning: without the answer's last token (EOS), as that "
                                            "framework scores them (ES >= 1/N) | all_tokens: every answer token "
                                            "avg_loss counts, EOS included (ES 0 when the last is wrong)")
    every_steps: int | None = setting(None, "evaluate during training every N optimizer steps (and at the last) on "
                                       "during_rows rows of the forget and retain splits (ROUGE-L, truth ratio, Prob, "
                                       "fact recall, fluency); the curve joins metrics.json's history as eval_* keys")
    during_rows: int = setting(16, "rows of each split in the evaluation during training")
    keep_best: str | None = setting(None, "end the run on the evaluation during training with the best value of this "
                                     "metric expression (e.g. 'retain_rougeL_recall - forget_rougeL_recall') instead "
                                     "of the last step; needs every_steps")
    keep_best_direction: str = setting("maximize", "maximize | minimize: which end of keep_best is best")

    def __post_init__(self) -> None:
        require(self.max_new_tokens >= 1, "eval.max_new_tokens", self.max_new_tokens, ">= 1")
        require(self.batch_size == "auto" or (isinstance(self.batch_size, int) and not isinstance(self.batch_size, bool)
                                              and self.batch_size >= 1),
                "eval.batch_size", self.batch_size, "auto or a number of rows >= 1")
        require(self.max_examples is None or self.max_examples >= 1, "eval.max_examples", self.max_examples, ">= 1 or null")
        require(not (self.retain_model and self.retain_reference), "eval.retain_reference", self.retain_reference,
                "null when eval.retain_model is set: forget quality takes one reference, the retain model or "
                "its evaluation log")
        require(self.protocol in ("tofu", "closer_look"), "eval.protocol", self.protocol, "tofu or closer_look")
        require(self.token_rule in ("open_unlearning", "all_tokens"), "eval.token_rule", self.token_rule,
                 "open_unlearning or all_tokens")
        require(self.every_steps is None or self.every_steps >= 1, "eval.every_steps", self.every_steps, ">= 1 or null")
        require(self.during_rows >= 1, "eval.during_rows", self.during_rows, ">= 1")
        require(self.keep_best_direction in ("maximize", "minimize"), "eval.keep_best_direction",
                 self.keep_best_direction, "maximize or minimize")
        require(self.keep_best is None or self.every_steps is not None, "eval.keep_best", self.keep_best,
                 "null unless eval.every_steps is set (the best is chosen among the evaluations during training)")

    @property
    def rows(self) -> int | None:
        """eval.batch_size as the evaluation functions take it: None for auto."""
        return None if self.batch_size == "auto" else int(self.batch_size)


@dataclass(frozen=True)
class MuseEvalConfig:
    source: str = setting("", "MUSE directory (hub layout: verbmem/, knowmem/, privleak/) or hub id, e.g. muse-bench/MUSE-News")
    retrain_model: str | None = setting(None, "model trained without the forget corpus: its Min-K% AUC is PrivLeak's reference")
    verbmem_max_new_tokens: int = setting(128, "VerbMem continuation length (MUSE: 128)")
    knowmem_max_new_tokens: int = setting(32, "KnowMem answer length (MUSE: 32)")
    batch_size: int = setting(8, "evaluation batch size")
    max_examples: int | None = setting(None, "first N items of each part")
    privleak_window: int | None = setting(None, "tokens per forward pass of PrivLeak's Min-K% (null: the model's "
                                           "max_position_embeddings); MUSE's code scores each whole document in one "
                                           "pass, so longer documents are scored in overlapping windows")
    privleak_stride: int | None = setting(None, "step between those windows (null: window // 2); every token after BOS "
                                           "is scored once, with >= window - stride tokens of context")
    privleak_max_tokens: int | None = setting(None, "score only the first N tokens (BOS included) of each PrivLeak "
                                               "document (quick looks); null: whole documents, as MUSE")

    def __post_init__(self) -> None:
        for key in ("batch_size", "verbmem_max_new_tokens", "knowmem_max_new_tokens"):
            require(getattr(self, key) >= 1, f"muse.{key}", getattr(self, key), ">= 1")
        for key, low in (("max_examples", 1), ("privleak_window", 2), ("privleak_stride", 1),
                         ("privleak_max_tokens", 2)):
            value = getattr(self, key)
            require(value is None or value >= low, f"muse.{key}", value, f">= {low} or null")
        require(self.privleak_stride is None or self.privleak_window is None
                 or self.privleak_stride < self.privleak_window, "muse.privleak_stride", self.privleak_stride,
                 f"< muse.privleak_window ({self.privleak_window}) so windows overlap")


@dataclass(frozen=True)
class ContinualConfig:
    requests: int | None = setting(None, "number of sequential forget requests the forget split is cut into, by "
                                    "author (e.g. 10 on forget10 = TOFU's forget01 tasks); null: see authors_per_request")
    authors_per_request: int | None = setting(None, "authors per request instead of a request count (TOFU: 2 authors "
                                               "= forget01 task, 20 = forget10 task); both null: continual mode off")
    eval_every: int = setting(1, "evaluate every forget set seen so far after every k-th request (always after the last)")
    max_new_tokens: int = setting(64, "greedy answer length of the per-request evaluation")
    batch_size: int = setting(16, "batch size of the per-request evaluation")

    def __post_init__(self) -> None:
        for key in ("requests", "authors_per_request", "eval_every", "max_new_tokens", "batch_size"):
            value, nullable = getattr(self, key), key in ("requests", "authors_per_request")
            require(value >= 1 if value is not None else nullable, f"continual.{key}", value,
                     ">= 1 or null" if nullable else ">= 1")

    @property
    def enabled(self) -> bool:
        """Continual mode is on when requests or authors_per_request is set (docs/METHODS.md §1.5)."""
        return self.requests is not None or self.authors_per_request is not None


@dataclass(frozen=True)
class HubConfig:
    push: bool = setting(False, "upload the saved model, its model card and receipt to the Hugging Face Hub after a "
                                "successful run (as `obliviate push`; token: HF_TOKEN or `hf auth login`)")
    repo_id: str | None = setting(None, "owner/name of the model repository (created when missing); needed for push")
    private: bool = setting(False, "create the repository private (an existing one keeps its visibility)")
    revision: str | None = setting(None, "branch to push to, created when missing (null: main)")

    def __post_init__(self) -> None:
        require(not self.push or bool(self.repo_id), "hub.repo_id", self.repo_id,
                "set to owner/name when hub.push is true (e.g. hub.repo_id=my-org/llama-forget10)")
        require(self.repo_id is None or is_owner_name(self.repo_id), "hub.repo_id", self.repo_id,
                "owner/name (letters, digits, '-', '_', '.'), e.g. my-org/llama-forget10")
