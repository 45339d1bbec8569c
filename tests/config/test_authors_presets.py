"""The presets that follow the authors' own scripts hold the authors' values, cell by cell.

The tables below were read off the authors' code by hand (file:line at the commit named); they are not imported
from scripts/make_presets.py, so a preset that drifts from the authors fails here. Each CPU twin runs for real.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from obliviate.config import RunConfig, load_config
from obliviate.train.schedule import schedule

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"

# Salehzz/ASU-unlearning@2bdc362, Right-to-be-forgotten/ (the ASU authors' TOFU code).
ASU_TOFU = {
    "tau": (2.3, "scripts/tofu/asu.sh:30"),
    "layers": (None, "scripts/tofu/asu.sh:31 (null: my_models/my_llama.py smooths every layer)"),
    "gamma": (0.1, "scripts/tofu/asu.sh:32 forget_coeff"),
    "alpha": (1.0, "scripts/tofu/asu.sh:33 regularization_coeff"),
    "lr": (1e-5, "scripts/tofu/asu.sh:21"),
    "epochs": (5, "scripts/tofu/asu.sh:37"),
    "global_batch": (32, "config/tofu.yaml:21-22 (4 x 4) x torchrun --nproc_per_node=2, scripts/tofu/asu.sh:54"),
    "max_length": (500, "forget.py:116"),
    "weight_decay": (0.01, "config/tofu.yaml:30"),
    "scheduler": ("linear", "forget.py:150-167 sets none: the Trainer's default"),
    "prompt": ("[INST] {question} [/INST]", "config/model_config.yaml:4-5 question_start_tag / question_end_tag"),
    "model": ("locuslab/tofu_ft_llama2-7b", "config/tofu.yaml:3"),
    "tokenizer": ("NousResearch/Llama-2-7b-chat-hf", "config/model_config.yaml:3"),
    "optimizer": ("paged_adamw", "forget.py:160 optim paged_adamw_32bit"),
}
TOFU_ROWS = {"01": 40, "05": 200, "10": 400}


def authors_schedule(rows: int) -> tuple[int, int]:
    """forget.py:121-126, rewritten: steps_per_epoch = N // 32; max_steps = int(5 N) // 32; warm-up = steps_per_epoch
    when it is above 1, else 0."""
    per_epoch = rows // 32
    return int(5 * rows) // 32, per_epoch if per_epoch > 1 else 0


ASU_PRESETS = sorted((CONFIGS / "gpu" / "asu_tofu_llama2_7b").glob("*.yaml"))


def test_every_asu_tofu_recipe_has_a_gpu_preset_and_a_twin() -> None:
    names = {p.name for p in ASU_PRESETS}
    assert names == {f"{m}_forget{s}.yaml" for m in ("asu_gd", "asu_kl", "asu_kl_released") for s in TOFU_ROWS} | {
        "asu_gd_continual_forget01.yaml", "asu_kl_continual_forget01.yaml"}  # scripts/continual_tofu/asu.sh
    assert names == {p.name for p in (CONFIGS / "twins" / "asu_tofu_llama2_7b").glob("*.yaml")}


@pytest.mark.parametrize("path", ASU_PRESETS, ids=lambda p: p.stem)
def test_asu_tofu_presets_hold_the_authors_values(path: Path) -> None:
    cfg = load_config(RunConfig, path)
    split = path.stem.rsplit("forget", 1)[1]
    m, t = cfg.method, cfg.train
    got = {"tau": m.forget_args["tau"], "layers": m.forget_args["layers"], "gamma": m.gamma, "alpha": m.alpha,
           "lr": t.lr, "epochs": t.epochs, "global_batch": t.batch_size * t.grad_accum, "max_length": cfg.data.max_length,
           "weight_decay": t.weight_decay, "scheduler": t.scheduler, "prompt": cfg.model.chat.prompt_template,
           "model": cfg.model.path, "tokenizer": cfg.model.tokenizer, "optimizer": t.optimizer}
    for key, (value, where) in ASU_TOFU.items():
        assert got[key] == value, f"{path.name}: {key} = {got[key]!r}, the authors' {where} says {value!r}"
    sch = schedule(TOFU_ROWS[split], t.batch_size, t)  # one GPU: batch_size x grad_accum = the global 32
    assert (sch.steps, sch.warmup) == authors_schedule(TOFU_ROWS[split]), path.name
    continual = "_continual" in path.stem
    if continual:  # scripts/continual_tofu/asu.sh:9,38: forget01 tasks 1..10 in order = forget10 in ten requests
        assert (cfg.data.forget_split, cfg.data.retain_split, cfg.continual.requests) == ("forget10", "retain90", 10)
    else:
        assert cfg.data.forget_split == f"forget{split}"
        assert cfg.data.retain_split == f"retain{100 - int(split):02d}"  # the other authors: their task-1 retain pool
    assert m.forget == "asu"
    assert cfg.model.dtype == "float32" and t.precision == "bf16"  # fp32 master weights, bf16 compute
    kind = path.stem.rsplit("_forget", 1)[0].replace("_continual", "")
    assert m.retain == {"asu_gd": "nll", "asu_kl": "kl", "asu_kl_released": "kl"}[kind]
    # the released TOFU term: trainer/losses.py:197 (the second kl_loss) over every position of rows padded to 500
    assert m.retain_args.get("positions", "answer") == ("max_length" if kind == "asu_kl_released" else "answer")


def test_the_authors_schedule_by_hand() -> None:
    """forget01: 200 // 32 = 6 steps, 40 // 32 = 1 step an epoch -> no warm-up; forget05: 1000 // 32 = 31 and 6;
    forget10: 2000 // 32 = 62 and 12."""
    assert [authors_schedule(n) for n in TOFU_ROWS.values()] == [(6, 0), (31, 6), (62, 12)]


# Salehzz/ASU-unlearning@2bdc362, open-unlearning/: the authors' MUSE runs (src/trainer/unlearn/ASU.py:102 weights
# the FORGET term by `alpha`: loss = alpha * forget_loss + retain_loss).
ASU_MUSE = {"": (2.0, 0.35, "scripts/muse_unlearn.sh:100-101"), "_books": (2.35, 0.001, "scripts/muse_unlearn.sh:134-135")}


@pytest.mark.parametrize("suffix", ASU_MUSE)
@pytest.mark.parametrize("name", ["asu_gd", "asu_kl"])
def test_asu_muse_presets_hold_the_authors_values(name: str, suffix: str) -> None:
    tau, forget_weight, where = ASU_MUSE[suffix]
    cfg = load_config(RunConfig, CONFIGS / "muse" / f"{name}{suffix}.yaml")
    assert (cfg.method.forget_args["tau"], cfg.method.gamma, cfg.method.alpha) == (tau, forget_weight, 1.0), where
    assert cfg.method.forget_args["layers"] is None  # ASU.py:38 passes no layers: every layer is smoothed
    assert cfg.data.windows == "stream" and cfg.data.max_length == 2048
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.scheduler, cfg.train.weight_decay) == (1e-5, 10, "constant", 0.0)
    assert cfg.train.batch_size * cfg.train.grad_accum == 32  # muse_unlearn.sh: 4 x 4 x 2 processes


# sustech-nlp/SAGO@2363ee7 configs/experiment/unlearn/wmdp/: (rule, corpus) -> alpha (retain), gamma (forget), lr,
# steps, file:lines. The *_sago / *_pcgrad files inherit default.yaml (alpha 1.0 :46, gamma 1.0 :47) and override.
WMDP_GRADDIFF = {
    ("sum", "bio"): (1.0, 1.0, 3e-6, 100, "GradDiff_bio.yaml:41-47"),
    ("sum", "cyber"): (1.0, 1.0, 5e-6, 100, "GradDiff_cyber.yaml:41-47"),
    ("sago", "bio"): (0.5, 1.0, 1e-5, 500, "GradDiff_sago_bio.yaml:10-16"),
    ("sago", "cyber"): (1.0, 1.0, 1e-5, 500, "GradDiff_sago_cyber.yaml:10-16"),
    ("pcgrad", "bio"): (1.0, 1.0, 1e-5, 100, "GradDiff_pcgrad_bio.yaml:10-14, default.yaml:46-47"),
    ("pcgrad", "cyber"): (1.0, 1.0, 1e-5, 100, "GradDiff_pcgrad_cyber.yaml:10-14, default.yaml:46-47"),
    ("pcgrad_global", "bio"): (1.0, 1.0, 1e-5, 300, "GradDiff_pcgrad_global_bio.yaml:10-14, default.yaml:46-47"),
    ("pcgrad_global", "cyber"): (1.0, 1.0, 1e-5, 100, "GradDiff_pcgrad_global_cyber.yaml:10-14, default.yaml:46-47"),
}


@pytest.mark.parametrize("key", WMDP_GRADDIFF, ids=lambda k: "_".join(k))
def test_wmdp_graddiff_presets_hold_sagos_values(key: tuple[str, str]) -> None:
    rule, corpus = key
    alpha, gamma, lr, steps, where = WMDP_GRADDIFF[key]
    cfg = load_config(RunConfig, CONFIGS / "wmdp" / f"graddiff_{rule}_{corpus}.yaml")
    m, t = cfg.method, cfg.train
    assert (m.forget, m.retain, m.combine.rule) == ("ga", "nll", rule)
    assert (m.alpha, m.gamma, t.lr, t.max_steps) == (alpha, gamma, lr, steps), where
    assert t.warmup_ratio == 0.1 and t.weight_decay == 0.0 and t.batch_size * t.grad_accum == 32
    assert cfg.data.windows == "stream" and cfg.data.max_length == 512


@pytest.mark.parametrize("name", ["asu_gd", "asu_kl", "asu_kl_released"])
def test_the_cpu_twins_run_their_recipe(name: str, model_dir: Path, tmp_path: Path) -> None:
    """forget01's twin of each recipe trains two steps on the tiny model with the [INST] prompt and evaluates a few
    rows; the prompt travels with the saved model."""
    from obliviate.cli import main

    out = tmp_path / "run"
    rc = main(["unlearn", "--config", str(CONFIGS / "twins" / "asu_tofu_llama2_7b" / f"{name}_forget01.yaml"),
               f"model.path={model_dir}", "train.max_steps=2", "train.grad_accum=2", "train.batch_size=2",
               "train.progress=false", f"eval.retain_model={model_dir}", "eval.max_examples=2",
               "eval.max_new_tokens=4", "eval.memorization=false", "eval.holdout_split=null", f"output_dir={out}"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2 and metrics["eval"]["forget_quality"] is not None
    assert json.loads((out / "chat_format.json").read_text())["prompt_template"] == "[INST] {question} [/INST]"


def test_the_continual_twin_runs_its_requests_in_order(model_dir: Path, tmp_path: Path) -> None:
    """The continual recipe's twin, cut to two requests of one step each: each request starts from the last."""
    from obliviate.cli import main

    out = tmp_path / "run"
    rc = main(["unlearn", "--config", str(CONFIGS / "twins" / "asu_tofu_llama2_7b" / "asu_gd_continual_forget01.yaml"),
               f"model.path={model_dir}", "continual.requests=2", "continual.max_new_tokens=4", "train.max_steps=1",
               "train.grad_accum=1", "train.batch_size=2", "train.progress=false", "eval.enabled=false",
               f"output_dir={out}"])
    assert rc == 0 and "| 2 |" in (out / "continual.md").read_text()


def test_a_twin_whose_warmup_outlasts_a_shortened_run_is_refused(model_dir: Path, tmp_path: Path, capsys) -> None:
    """forget05: one epoch's warm-up is 6 steps; cut to 2 steps the run would never leave it."""
    from obliviate.cli import main

    out = tmp_path / "run"
    rc = main(["validate", "--config", str(CONFIGS / "twins" / "asu_tofu_llama2_7b" / "asu_gd_forget05.yaml"),
               f"model.path={model_dir}", "train.max_steps=2", f"output_dir={out}"])
    assert rc == 2 and "train.warmup_epochs=1.0 gives 6 warm-up steps" in capsys.readouterr().err
    assert not out.exists()


# sustech-nlp/SAGO@2363ee7 configs/experiment/unlearn/wmdp/: (method, rule, corpus) -> forget args, alpha (retain),
# gamma (forget), max_steps, file:lines (lr 1e-5 and warmup_ratio 0.1 in every one). The *_bio surgery files inherit
# the *_sago_cyber file and override lines 10-17.
WMDP_NPO = {
    ("npo", "sum", "bio"): ({"beta": 0.01}, 0.1, 1.0, 100, "NPO_bio.yaml:41-48"),
    ("npo", "sum", "cyber"): ({"beta": 0.01}, 0.1, 1.0, 100, "NPO_cyber.yaml:41-48"),
    ("npo", "pcgrad", "bio"): ({"beta": 0.0001}, 1.0, 0.1, 100, "NPO_pcgrad_bio.yaml:10-17"),
    ("npo", "pcgrad", "cyber"): ({"beta": 0.005}, 0.1, 1.0, 100, "NPO_pcgrad_cyber.yaml:10-17"),
    ("npo", "sago", "bio"): ({"beta": 0.0001}, 1.0, 0.1, 150, "NPO_sago_bio.yaml:10-16"),
    ("npo", "sago", "cyber"): ({"beta": 0.001}, 0.1, 1.0, 300, "NPO_sago_cyber.yaml:41-49"),
    ("simnpo", "sum", "bio"): ({"beta": 0.7, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_bio.yaml:41-49"),
    ("simnpo", "sum", "cyber"): ({"beta": 0.75, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_cyber.yaml:41-49"),
    ("simnpo", "pcgrad", "bio"): ({"beta": 0.02, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_pcgrad_bio.yaml:10-19"),
    ("simnpo", "pcgrad", "cyber"): ({"beta": 1.0, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_pcgrad_cyber.yaml:10-19"),
    ("simnpo", "sago", "bio"): ({"beta": 0.02, "delta": 0.1}, 0.1, 1.0, 150, "SimNPO_sago_bio.yaml:10-17"),
    ("simnpo", "sago", "cyber"): ({"beta": 0.1, "delta": 0.1}, 0.1, 1.0, 200, "SimNPO_sago_cyber.yaml:41-51"),
}


@pytest.mark.parametrize("key", WMDP_NPO, ids=lambda k: "_".join(k))
def test_wmdp_npo_and_simnpo_presets_hold_sagos_values(key: tuple[str, str, str]) -> None:
    method, rule, corpus = key
    args, alpha, gamma, steps, where = WMDP_NPO[key]
    cfg = load_config(RunConfig, CONFIGS / "wmdp" / f"{method}_{rule}_{corpus}.yaml")
    m, t = cfg.method, cfg.train
    assert (m.forget, m.retain, m.combine.rule, m.forget_args) == (method, "nll", rule, args), where
    assert (m.alpha, m.gamma, t.lr, t.max_steps, t.warmup_ratio) == (alpha, gamma, 1e-5, steps, 0.1), where
    assert t.weight_decay == 0.0 and t.batch_size * t.grad_accum == 32  # wmdp_unlearn.sh: 2 x 4 x 4 processes
    assert cfg.data.windows == "stream" and cfg.data.max_length == 512


# sustech-nlp/SAGO@2363ee7 configs/experiment/unlearn/rwku/Batch50_*.yaml: name -> forget, forget args, retain, alpha,
# gamma, rule, lr, file:lines. Every file: num_train_epochs 2 (:38), warmup_ratio 0.1 (:39), data/rwku/Batch/1-50
# (:12, :22, :27); scripts/rwku_*.sh:17-19: 4 per device x 2 accumulation x 4 processes.
RWKU = {
    "ga": ("ga", {}, None, None, None, "sum", 7e-7, "Batch50_GradAscent.yaml:37"),
    "npo_forget": ("npo", {"beta": 0.001}, None, None, None, "sum", 3e-6, "Batch50_NPOForget.yaml:37-42"),
    "simnpo_forget": ("simnpo", {"beta": 0.5, "delta": 0.1}, None, None, None, "sum", 3e-6,
                      "Batch50_SimNPOForget.yaml:37-43"),
    "graddiff_sum": ("ga", {}, "nll", 1.0, 1.0, "sum", 8e-7, "Batch50_GradDiff.yaml:37-43"),
    "npo_sum": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "sum", 3e-6, "Batch50_NPO.yaml:37-44"),
    "simnpo_sum": ("simnpo", {"beta": 0.5, "delta": 0.1}, "nll", 1.0, 1.0, "sum", 8e-6, "Batch50_SimNPO.yaml:37-45"),
    "graddiff_pcgrad": ("ga", {}, "nll", 1.0, 1.0, "pcgrad", 3e-6, "Batch50_PCGrad.yaml:37-44"),
    "graddiff_pcgrad_global": ("ga", {}, "nll", 1.0, 1.0, "pcgrad_global", 4e-6, "Batch50_PCGrad_global.yaml:37-44"),
    "npo_pcgrad": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "pcgrad", 8e-6, "Batch50_PCGrad_NPO.yaml:8-15"),
    "simnpo_pcgrad": ("simnpo", {"beta": 0.5, "delta": 0.1}, "nll", 0.5, 1.0, "pcgrad", 8e-6,
                      "Batch50_PCGrad_SimNPO.yaml:8-16"),
    "graddiff_sago": ("ga", {}, "nll", 1.0, 1.0, "sago", 1e-5, "Batch50_SAGO.yaml:37-44"),
    "npo_sago": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "sago", 1e-5, "Batch50_SAGO_NPO.yaml:37-46"),
    "simnpo_sago": ("simnpo", {"beta": 0.1, "delta": 0.1}, "nll", 0.1, 1.0, "sago", 1e-5,
                    "Batch50_SAGO_SimNPO.yaml:37-47"),
}


@pytest.mark.parametrize("name", RWKU)
def test_rwku_presets_hold_sagos_values(name: str) -> None:
    forget, args, retain, alpha, gamma, rule, lr, where = RWKU[name]
    cfg = load_config(RunConfig, CONFIGS / "rwku" / f"{name}.yaml")
    m, t, d = cfg.method, cfg.train, cfg.data
    assert (m.forget, m.forget_args, m.retain, m.combine.rule, t.lr) == (forget, args, retain, rule, lr), where
    if retain is not None:  # the forget-only baselines take no weights
        assert (m.alpha, m.gamma) == (alpha, gamma), where
    assert (t.epochs, t.max_steps, t.warmup_ratio, t.scheduler, t.weight_decay) == (2, None, 0.1, "linear", 0.0)
    assert t.batch_size * t.grad_accum * 4 == 32 and t.fsdp and t.precision == "bf16"
    assert cfg.model.dtype == "float32" and cfg.model.path == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert (d.source, d.forget_split, d.retain_split) == ("data/rwku/Batch/1-50", "passage", "retain_passage")
    assert (d.format, d.windows, d.max_length) == ("text", "stream", 512)


@pytest.mark.parametrize("name", ["simnpo_sago_bio", "npo_pcgrad_bio", "graddiff_pcgrad_global_bio", "rmu_sum_bio"])
def test_the_wmdp_recipes_run_on_a_made_up_corpus(name: str, model_dir: Path, tmp_path: Path) -> None:
    """WMDP's corpora are gated or on the hub, so its presets have no shipped twins: each recipe (objective, weights,
    rule, stream windows, warm-up, schedule) runs here for a few steps on a made-up corpus in SAGO's file layout,
    on the 2-layer tiny model (RMU at layer 1), windows of 16 tokens."""
    from obliviate.cli import main

    corpora = tmp_path / "wmdp-corpora"
    corpora.mkdir()
    for side in ("forget", "retain"):
        docs = [json.dumps({"text": f"A {side} document number {i} about the town of Ash and its people."})
                for i in range(8)]
        (corpora / f"bio-{side}-corpus.jsonl").write_text("\n".join(docs) + "\n", encoding="utf-8")
    rmu = ["method.forget_args.layer=1", "method.retain_args.layer=1"] if name.startswith("rmu") else []
    out = tmp_path / "run"
    rc = main(["unlearn", "--config", str(CONFIGS / "wmdp" / f"{name}.yaml"), f"model.path={model_dir}",
               "model.dtype=float32", f"data.source={corpora}", "data.max_length=16", "train.max_steps=3",
               "train.batch_size=2", "train.grad_accum=1", "train.progress=false", *rmu, f"output_dir={out}"])
    assert rc == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert len(history) == 3 and all(h["loss"] == h["loss"] for h in history)
