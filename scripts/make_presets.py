"""Write the method presets in configs/{tofu,synthetic,muse,wmdp,rwku,gpu,twins}/ (complete YAMLs, no includes).

Run from the repository root after changing a preset here: python scripts/make_presets.py
Every preset's header names the reference (repository + file) its values come from. Hyper-parameters of a
method (α, β, γ, δ, ...) are the published ones on every target; training schedules are the references' for
TOFU, MUSE and WMDP, and the demo's own for the synthetic world (a from-scratch model, no reference).
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from obliviate.published import OPEN_UNLEARNING_TOFU_1B

OU = "locuslab/open-unlearning"
CL = "sail-sg/closer-look-LLM-unlearning"
SAGO = "sustech-nlp/SAGO"
SIMPLE = "OPTML-Group/Unlearn-Simple"
ASU = "Salehzz/ASU-unlearning@2bdc362"  # the ASU authors' code, the commit read
RTBF = f"{ASU} Right-to-be-forgotten"  # its TOFU code (a fork of closer-look)
ASU_OU = f"{ASU} open-unlearning"  # its patched open-unlearning (MUSE)
SAGO_AT = "sustech-nlp/SAGO@2363ee7"
ASU_SRC = (f"the ASU authors' code, {RTBF}/trainer/losses.py asu_loss (KL(teacher || student) per answer token, "
           "mean per example, then over examples) and my_models/my_llama.py (QK^T / (sqrt(d) tau) on every layer "
           "when layers_id is null)")


def _method(desc: str, method: dict, src: str, *, train: dict | None = None, train_src: str = "",
            muse: dict | None = None, muse_src: str = "", target: dict | None = None) -> dict:
    """One named recipe: description, method section and its source, per-target training overrides and their
    source, the MUSE method section where MUSE's reference differs, and per-target overrides of the method's
    forget_args and of the data section (`target`: {target: {"forget_args": {...}, "data": {...}}})."""
    return {"desc": desc, "method": method, "src": src, "train": train or {}, "train_src": train_src,
            "muse": muse, "muse_src": muse_src, "target": target or {}}


# name -> recipe. `train` maps a target to the training values that differ from that target's defaults.
METHODS = {
    "grad_ascent": _method("GradAscent: gradient ascent on the forget set, no retain term",
                           {"forget": "ga", "retain": None}, f"{OU} configs/trainer/GradAscent.yaml"),
    "graddiff": _method("GradDiff: gradient ascent + NLL on retain (alpha 1, gamma 1)",
                        {"forget": "ga", "retain": "nll", "alpha": 1.0, "gamma": 1.0},
                        f"{OU} configs/trainer/GradDiff.yaml"),
    "npo": _method("NPO (beta 0.1) + NLL on retain (alpha 1, gamma 1)",
                   {"forget": "npo", "forget_args": {"beta": 0.1}, "retain": "nll", "alpha": 1.0, "gamma": 1.0},
                   f"{OU} configs/trainer/NPO.yaml"),
    "simnpo": _method("SimNPO + NLL on retain",
                      {"forget": "simnpo", "forget_args": {"beta": 4.5, "delta": 0.0}, "retain": "nll",
                       "alpha": 1.0, "gamma": 0.125},
                      f"{OU} configs/trainer/SimNPO.yaml (beta 4.5, delta 0, gamma 0.125, alpha 1)",
                      muse={"forget": "simnpo", "forget_args": {"beta": 0.75, "delta": 3.0}, "retain": "nll",
                            "alpha": 0.1, "gamma": 1.0},
                      muse_src=f"{SIMPLE} MUSE/README.md, the News command (beta 0.75, gamma=delta 3, coeff=alpha "
                               "0.1, npo_coeff=gamma 1)"),
    "idk_dpo": _method("IdkDPO: DPO with a refusal as the preferred answer (beta 0.1) + NLL on retain",
                       {"forget": "idk_dpo", "forget_args": {"beta": 0.1}, "retain": "nll", "alpha": 1.0,
                        "gamma": 1.0}, f"{OU} configs/trainer/DPO.yaml"),
    "idk_ap": _method("IDK+AP: NLL of a refusal + answer preservation on retain (AP beta 0.1)",
                      {"forget": "idk", "retain": "ap", "retain_args": {"beta": 0.1}, "alpha": 1.0, "gamma": 1.0,
                       "refusal_draw": "per_example"},
                      f"{CL} scripts/tofu/idk_ap.sh, config/tofu.yaml (beta 0.1), trainer/losses.py; one refusal per "
                      "question for the run: its dataset/data_module.py seeds the draw with the question's index",
                      train={"tofu": {"epochs": 5, "warmup_ratio": 0.2}},
                      train_src=f"5 epochs, warm-up 1 epoch: {CL} scripts/tofu/idk_ap.sh, forget.py"),
    "me_gd": _method("ME+GD: maximum entropy on every forget token, prompt included (gamma 0.1) + NLL on retain",
                     {"forget": "me", "forget_args": {"positions": "sequence"}, "retain": "nll", "alpha": 1.0,
                      "gamma": 0.1},
                     f"{CL} scripts/tofu/me_gd.sh (mask=false, forget_coeff 0.1, regularization_coeff 1); on TOFU "
                     "every position of rows padded to 500 tokens, padding included (positions max_length): its "
                     "dataset/data_module.py pads with EOS to the max_length 500 its forget.py passes",
                     target={"tofu": {"forget_args": {"positions": "max_length"}, "data": {"max_length": 500}}},
                     train={"tofu": {"epochs": 5, "warmup_ratio": 0.2}},
                     train_src=f"5 epochs, warm-up 1 epoch: {CL} scripts/tofu/me_gd.sh, forget.py"),
    "undial": _method("UNDIAL: self-distillation to reference logits with the gold token lowered (beta 10), no retain "
                      "term",
                      {"forget": "undial", "forget_args": {"beta": 10.0, "positions": "batch"}, "retain": None,
                       "gamma": 1.0},
                      f"{OU} configs/trainer/UNDIAL.yaml (beta 10, alpha 0, gamma 1); every position of the padded "
                      "batch counts (positions batch), as src/trainer/utils.py compute_undial_loss",
                      train={t: {"lr": 1.0e-4, "batch_size": 2, "grad_accum": 8} for t in ("tofu", "muse")},
                      train_src=f"lr 1e-4 and batch 2 x 8: {OU} configs/trainer/UNDIAL.yaml, "
                                "community/methods/UNDIAL/README.md"),
    "rmu": _method("RMU: steer layer-L hidden states of forget text to c*u, keep retain hidden states (alpha x MSE)",
                   {"forget": "rmu", "retain": "hidden_mse", "alpha": 1.0, "gamma": 1.0},
                   "per target (see TARGETS[...]['rmu'])"),
    "asu_gd": _method("ASU_GD: attention-smoothing distillation + NLL on retain", {"forget": "asu", "retain": "nll"},
                      ASU_SRC, muse={"forget": "asu", "retain": "nll", "gamma": 0.35},
                      muse_src=f"{ASU_SRC}; MUSE-News: {ASU_OU}/scripts/muse_unlearn.sh:100-101 (alpha 0.35, which "
                               "src/trainer/unlearn/ASU.py:102 puts on the FORGET term = our gamma; tau 2.0)"),
    "asu_kl": _method("ASU_KL: attention-smoothing distillation + KL to the original model on retain",
                      {"forget": "asu", "retain": "kl"},
                      ASU_SRC, muse={"forget": "asu", "retain": "kl", "gamma": 0.35},
                      muse_src=f"{ASU_SRC}; MUSE-News: {ASU_OU}/scripts/muse_unlearn.sh:100-101 (alpha 0.35, which "
                               "src/trainer/unlearn/ASU.py:102 puts on the FORGET term = our gamma; tau 2.0)"),
    "simnpo_sago": _method("SimNPO+GD with SAGO (beta 0.02, delta 0.1, alpha 0.1, gamma 1)",
                           {"forget": "simnpo", "forget_args": {"beta": 0.02, "delta": 0.1}, "retain": "nll",
                            "alpha": 0.1, "gamma": 1.0, "combine": {"rule": "sago"}},
                           f"{SAGO} configs/experiment/unlearn/wmdp/SimNPO_sago_bio.yaml"),
    "npo_pcgrad": _method("NPO+GD with module-wise PCGrad (alpha 1, gamma 0.1; beta 0.1)",
                          {"forget": "npo", "forget_args": {"beta": 0.1}, "retain": "nll", "alpha": 1.0,
                           "gamma": 0.1, "combine": {"rule": "pcgrad"}},
                          f"alpha, gamma: {SAGO} configs/experiment/unlearn/wmdp/NPO_pcgrad_bio.yaml; beta: "
                          f"{OU} configs/trainer/NPO.yaml (SAGO's 1e-4 is tuned to 512-token documents)"),
    "asu_sago": _method("ASU_GD with SAGO (retention first on conflicting coordinates)",
                        {"forget": "asu", "retain": "nll", "combine": {"rule": "sago"}},
                        f"{ASU_SRC}, with the rule of {SAGO_AT} src/trainer/unlearn/grad_surgery.py _apply_sago "
                        "(no author ran this pair)"),
}

TARGETS = {
    "tofu": {
        "note": "TOFU forget01 (the copy shipped with obliviate) from the target of configs/tofu/finetune_target_tiny.yaml; for a "
                "published TOFU model pass model.path=<hub id> eval.retain_model=<its retain99 twin> (and "
                "RMU's layer, e.g. 7 of Llama-3.2-1B); for the hub data pass data.source=locuslab/TOFU.",
        "train_src": f"{OU} configs/experiment/unlearn/tofu/default.yaml (warmup_epochs 1, weight_decay 0.01, "
                     "10 epochs, lr 1e-5) and configs/trainer/finetune.yaml (batch 8 x 4, paged AdamW)",
        "model": {"path": "runs/tofu-target-tiny"},
        "data": {"source": "tofu", "forget_split": "forget01", "retain_split": "retain99",
                 "max_length": 256},
        "train": {"epochs": 10, "batch_size": 8, "grad_accum": 4, "lr": 1.0e-5, "scheduler": "linear",
                  "warmup_ratio": 0.1, "weight_decay": 0.01},
        "eval": {"forget_split": "forget01_perturbed", "retain_model": "runs/tofu-retain99-tiny"},
        "asu_args": {"tau": 2.0, "layers": None},
        "rmu_layer": 2,  # the tiny 4-layer target
        "rmu": {"steering_coef": 300.0, "alpha": 1000.0, "trainable_params": "wmdp",
                "src": f"{OU} configs/trainer/RMU.yaml at commit 8f9872c (steering_coeff 300, alpha 1000, module "
                       "layer 7, trainable mlp.down_proj of layers 5-7 = trainable_params wmdp)"},
    },
    "synthetic": {
        "note": "the demo's synthetic world and target model (run `obliviate demo` first); forget10 = 2 authors.",
        "train_src": "the demo's own schedule for its from-scratch model (no reference)",
        "model": {"path": "obliviate-demo/models/target"},
        "data": {"source": "obliviate-demo/world", "forget_split": "forget10", "retain_split": "retain90",
                 "max_length": 96},
        "train": {"epochs": 20, "batch_size": 8, "lr": 1.0e-3, "scheduler": "constant", "weight_decay": 0.0},
        "eval": {"forget_split": "forget10_perturbed", "retain_model": "obliviate-demo/models/retain",
                 "batch_size": 32},
        "asu_args": {"tau": 16.0, "layers": [0]},
        "rmu_layer": 1,  # the demo's 2-layer model
        "rmu": {"steering_coef": 2.0, "alpha": 1.0, "trainable_params": [".*"],
                "src": "tuned to the demo's 2-layer from-scratch model (hidden states of norm ~1; c 300 would only "
                       "blow them up): c 2, alpha 1, every parameter"},
    },
    "muse": {
        "note": "MUSE-News raw text (hub; a local copy in the hub layout works too) from MUSE's target model; "
                "evaluated with VerbMem / KnowMem / PrivLeak. Needs a GPU in practice (2048-token windows, 7B).",
        "train_src": f"{OU} configs/experiment/unlearn/muse/default.yaml (10 epochs, lr 1e-5, constant, batch "
                     "4 x 8) and configs/trainer/finetune.yaml (weight_decay 0); windows as its src/data/pretraining.py "
                     "cuts raw text (data.windows stream)",
        "model": {"path": "muse-bench/MUSE-news_target"},
        "data": {"source": "muse-bench/MUSE-News", "forget_split": "raw/forget", "retain_split": "raw/retain1",
                 "max_length": 2048, "format": "text", "windows": "stream"},
        "train": {"epochs": 10, "batch_size": 4, "grad_accum": 8, "lr": 1.0e-5, "scheduler": "constant",
                  "weight_decay": 0.0},
        "eval": {"enabled": True},
        "muse": {"source": "muse-bench/MUSE-News", "retrain_model": "muse-bench/MUSE-news_retrain"},
        "asu_args": {"tau": 2.0, "layers": None},
        "rmu_layer": 7,
        "rmu": {"steering_coef": 300.0, "alpha": 1000.0, "trainable_params": "wmdp",
                "src": f"{OU} configs/trainer/RMU.yaml at commit 8f9872c (steering_coeff 300, alpha 1000, module "
                       "layer 7, trainable mlp.down_proj of layers 5-7 = trainable_params wmdp)"},
        "skip": ("idk_dpo", "idk_ap"),  # refusals answer questions; MUSE trains on raw text
    },
}


def _header(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def preset(name: str, target: str) -> tuple[str, dict]:
    """(header comment, config) of recipe `name` on `target`."""
    recipe, t = METHODS[name], TARGETS[target]
    on_muse = target == "muse" and recipe["muse"] is not None
    method = dict(recipe["muse"] if on_muse else recipe["method"])
    if method["forget"] == "asu":
        method["forget_args"] = dict(t["asu_args"])
    if method["forget"] == "rmu":
        r = t["rmu"]
        method["forget_args"] = {"layer": t["rmu_layer"], "steering_coef": r["steering_coef"],
                                 "trainable_params": r["trainable_params"]}
        method["retain_args"] = {"layer": t["rmu_layer"]}
        method["alpha"] = r["alpha"]
    over = recipe["target"].get(target, {})
    if "forget_args" in over:
        method["forget_args"] = {**method.get("forget_args", {}), **over["forget_args"]}
    train = {**t["train"], **recipe["train"].get(target, {})}
    cfg = {"model": t["model"], "data": {**t["data"], **over.get("data", {})}, "method": method, "train": train, "eval": t["eval"],
           **({"muse": t["muse"]} if "muse" in t else {}), "output_dir": f"runs/{target}-{name}"}
    train_src = t["train_src"] + (f"; {recipe['train_src']}" if target in recipe["train"] else "")
    header = _header([f"{recipe['desc']}.", f"Source: {t['rmu']['src'] if method['forget'] == 'rmu' else recipe['muse_src'] if on_muse else recipe['src']}.",
                      f"Training: {train_src}.",
                      f"On {t['note']}", f"Run from the repository root: obliviate unlearn --config "
                                         f"configs/{target}/{name}.yaml"])
    return header, cfg


# ----------------------------------------------------------------------------- WMDP (SAGO's headline setting)

WMDP_DIR = f"{SAGO} configs/experiment/unlearn/wmdp"
# (method, rule, corpus) -> forget_args, alpha, gamma, max_steps, source file; SAGO's experiment configs.
WMDP = {
    ("simnpo", "sum", "bio"): ({"beta": 0.7, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_bio.yaml"),
    ("simnpo", "sum", "cyber"): ({"beta": 0.75, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_cyber.yaml"),
    ("simnpo", "pcgrad", "bio"): ({"beta": 0.02, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_pcgrad_bio.yaml"),
    ("simnpo", "pcgrad", "cyber"): ({"beta": 1.0, "delta": 0.1}, 0.1, 1.0, 100, "SimNPO_pcgrad_cyber.yaml"),
    ("simnpo", "sago", "bio"): ({"beta": 0.02, "delta": 0.1}, 0.1, 1.0, 150, "SimNPO_sago_bio.yaml"),
    ("simnpo", "sago", "cyber"): ({"beta": 0.1, "delta": 0.1}, 0.1, 1.0, 200, "SimNPO_sago_cyber.yaml"),
    ("npo", "sum", "bio"): ({"beta": 0.01}, 0.1, 1.0, 100, "NPO_bio.yaml"),
    ("npo", "sum", "cyber"): ({"beta": 0.01}, 0.1, 1.0, 100, "NPO_cyber.yaml"),
    ("npo", "pcgrad", "bio"): ({"beta": 0.0001}, 1.0, 0.1, 100, "NPO_pcgrad_bio.yaml"),
    ("npo", "pcgrad", "cyber"): ({"beta": 0.005}, 0.1, 1.0, 100, "NPO_pcgrad_cyber.yaml"),
    ("npo", "sago", "bio"): ({"beta": 0.0001}, 1.0, 0.1, 150, "NPO_sago_bio.yaml"),
    ("npo", "sago", "cyber"): ({"beta": 0.001}, 0.1, 1.0, 300, "NPO_sago_cyber.yaml"),
}
# GradDiff: (rule, corpus) -> alpha (retain), gamma (forget), lr, max_steps, source file (helper-resolved Hydra chains:
# the *_pcgrad / *_sago files inherit configs/experiment/unlearn/wmdp/default.yaml: alpha 1, gamma 1, warmup_ratio 0.1).
WMDP_GD = {
    ("sum", "bio"): (1.0, 1.0, 3.0e-6, 100, "GradDiff_bio.yaml"),
    ("sum", "cyber"): (1.0, 1.0, 5.0e-6, 100, "GradDiff_cyber.yaml"),
    ("sago", "bio"): (0.5, 1.0, 1.0e-5, 500, "GradDiff_sago_bio.yaml"),
    ("sago", "cyber"): (1.0, 1.0, 1.0e-5, 500, "GradDiff_sago_cyber.yaml"),
    ("pcgrad", "bio"): (1.0, 1.0, 1.0e-5, 100, "GradDiff_pcgrad_bio.yaml"),
    ("pcgrad", "cyber"): (1.0, 1.0, 1.0e-5, 100, "GradDiff_pcgrad_cyber.yaml"),
    ("pcgrad_global", "bio"): (1.0, 1.0, 1.0e-5, 300, "GradDiff_pcgrad_global_bio.yaml"),
    ("pcgrad_global", "cyber"): (1.0, 1.0, 1.0e-5, 100, "GradDiff_pcgrad_global_cyber.yaml"),
}
# RMU: SAGO ran it with `sum` only (RMU_bio.yaml / RMU_cyber.yaml); the same values serve pcgrad and sago.
RMU_ALPHA = {"bio": 2.5, "cyber": 1.0}
WMDP_DATA = {  # SAGO reads data/wmdp/wmdp-corpora/<corpus>-{forget,retain}-corpus.jsonl
    "bio": {"source": "data/wmdp/wmdp-corpora", "forget_split": "bio-forget-corpus",
            "retain_split": "bio-retain-corpus"},
    "cyber": {"source": "cais/wmdp-corpora", "forget_split": "cyber-forget-corpus/train",
              "retain_split": "cyber-retain-corpus/train"},
}
WMDP_DATA_NOTE = {
    "bio": "the bio forget corpus is gated (request it at wmdp.ai / hub cais/wmdp-bio-forget-corpus); put it and "
           "cais/wmdp-corpora's bio-retain-corpus as JSONL ({\"text\": ...} a line) at data/wmdp/wmdp-corpora/"
           "bio-{forget,retain}-corpus.jsonl, the layout SAGO and open-unlearning's setup_data.py use",
    "cyber": "both corpora come from the hub (cais/wmdp-corpora, configs cyber-forget-corpus and "
             "cyber-retain-corpus); a local copy works with data.source=data/wmdp/wmdp-corpora "
             "data.forget_split=cyber-forget-corpus data.retain_split=cyber-retain-corpus",
}


RULE_LABEL = {"sum": "the plain sum", "pcgrad": "module-wise PCGrad", "sago": "SAGO", "pcgrad_global": "global PCGrad"}


def _memory(method: str, rule: str) -> str:
    """A rough GPU-memory estimate for Zephyr-7B in bf16 (7.2B parameters, ~14.5 GB per full copy); not measured."""
    if method == "rmu":
        return "about 35 GB (estimate: weights and the frozen copy; RMU trains three 4096x14336 matrices)"
    copies = 4 + (rule != "sum") + (method == "npo")  # weights, gradients, 2 AdamW moments, rule buffer, reference
    return f"about {round(copies * 14.5 + 8, -1):.0f} GB (estimate: {copies} bf16 copies of 7.2B parameters + activations)"


def wmdp_preset(method: str, rule: str, corpus: str) -> tuple[str, dict]:
    """(header, config) of `method` with gradient rule `rule` on WMDP `corpus` (bio | cyber), Zephyr-7B."""
    name = f"{method}_{rule}_{corpus}"
    train = {"max_steps": 100, "batch_size": 2, "grad_accum": 16, "lr": 1.0e-5, "scheduler": "linear",
             "warmup_ratio": 0.1, "weight_decay": 0.0, "max_grad_norm": 1.0}
    if method == "graddiff":
        alpha, gamma, lr, steps, file = WMDP_GD[(rule, corpus)]
        m = {"forget": "ga", "retain": "nll", "alpha": alpha, "gamma": gamma}
        train.update(max_steps=steps, lr=lr)
        src = f"{WMDP_DIR}/{file} (lr {lr:g}, {steps} steps, alpha {alpha:g}, gamma {gamma:g}, warmup_ratio 0.1)"
    elif method == "rmu":
        m = {"forget": "rmu", "forget_args": {"layer": 7, "steering_coef": 2.0, "trainable_params": "wmdp"},
             "retain": "hidden_mse", "retain_args": {"layer": 7}, "alpha": RMU_ALPHA[corpus], "gamma": 1.0}
        train.update(max_steps=80, lr=5.0e-5, scheduler="constant", warmup_ratio=0.0)
        src = (f"{WMDP_DIR}/RMU_{corpus}.yaml (steering_coeff 2, alpha {RMU_ALPHA[corpus]}, layer 7, trainable "
               "layers 5-7 mlp.down_proj, lr 5e-5, 80 steps, constant)")
        if rule != "sum":
            src += f"; SAGO has no RMU+{rule} config: the same values with rule {rule}"
    else:
        args, alpha, gamma, steps, file = WMDP[(method, rule, corpus)]
        m = {"forget": method, "forget_args": dict(args), "retain": "nll", "alpha": alpha, "gamma": gamma}
        train["max_steps"] = steps
        src = f"{WMDP_DIR}/{file} (lr 1e-5, warmup_ratio 0.1, {steps} steps)"
    if rule != "sum":
        m["combine"] = {"rule": rule}
    cfg = {"model": {"path": "HuggingFaceH4/zephyr-7b-beta", "dtype": "bfloat16"},
           "data": {**WMDP_DATA[corpus], "max_length": 512, "format": "text", "windows": "stream"},
           "method": m, "train": train, "eval": {"enabled": False}, "output_dir": f"runs/wmdp-{name}"}
    label = {"rmu": "RMU", "npo": "NPO+GD", "simnpo": "SimNPO+GD", "graddiff": "GradDiff"}[method]
    rule_label = RULE_LABEL[rule]
    header = _header([
        f"{label} with {rule_label} on WMDP-{corpus} (Zephyr-7B-beta; SAGO's headline setting).",
        f"Source: {src}.",
        f"Global batch 32 ({SAGO} scripts/wmdp_unlearn.sh, wmdp_baselines.sh); weight_decay 0 "
        f"({SAGO} configs/trainer/finetune.yaml); 512-token windows ({OU} configs/data/datasets/WMDP_forget.yaml), "
        f"cut as {SAGO} src/data/pretraining.py does (data.windows stream).",
        f"Data: {WMDP_DATA_NOTE[corpus]}.",
        f"One GPU: {_memory(method, rule)}.",
        f"Run from the repository root: obliviate unlearn --config configs/wmdp/{name}.yaml",
        f"Then: obliviate eval --benchmark mcq --model runs/wmdp-{name} --data cais/wmdp --split wmdp-{corpus} "
        f"--out runs/wmdp-{name}-eval-{corpus} model.dtype=bfloat16",
        f"and MMLU: obliviate eval --benchmark mcq --model runs/wmdp-{name} --data cais/mmlu --split all "
        f"--out runs/wmdp-{name}-eval-mmlu model.dtype=bfloat16 (SAGO: lm-eval mmlu 5-shot; ours is zero-shot).",
    ])
    return header, cfg


def wmdp_names() -> list[tuple[str, str, str]]:
    base = [(m, r, c) for m in ("rmu", "npo", "simnpo") for r in ("sum", "pcgrad", "sago") for c in ("bio", "cyber")]
    return base + [("graddiff", r, c) for r, c in WMDP_GD]


# ----------------------------------------------------------------------------- RWKU training (SAGO's Batch50 runs)

RWKU_DIR = f"{SAGO_AT} configs/experiment/unlearn/rwku"
# name -> forget, forget_args, retain, alpha (retain), gamma (forget), rule, lr, SAGO's file (its values: lines 37-47, or
# 8-16 of the PCGrad_NPO / PCGrad_SimNPO files that inherit Batch50_SAGO_NPO / Batch50_SAGO_SimNPO).
RWKU = {
    "ga": ("ga", {}, None, 1.0, 1.0, "sum", 7e-7, "Batch50_GradAscent.yaml"),
    "npo_forget": ("npo", {"beta": 0.001}, None, 1.0, 1.0, "sum", 3e-6, "Batch50_NPOForget.yaml"),
    "simnpo_forget": ("simnpo", {"beta": 0.5, "delta": 0.1}, None, 1.0, 1.0, "sum", 3e-6, "Batch50_SimNPOForget.yaml"),
    "graddiff_sum": ("ga", {}, "nll", 1.0, 1.0, "sum", 8e-7, "Batch50_GradDiff.yaml"),
    "npo_sum": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "sum", 3e-6, "Batch50_NPO.yaml"),
    "simnpo_sum": ("simnpo", {"beta": 0.5, "delta": 0.1}, "nll", 1.0, 1.0, "sum", 8e-6, "Batch50_SimNPO.yaml"),
    "graddiff_pcgrad": ("ga", {}, "nll", 1.0, 1.0, "pcgrad", 3e-6, "Batch50_PCGrad.yaml"),
    "graddiff_pcgrad_global": ("ga", {}, "nll", 1.0, 1.0, "pcgrad_global", 4e-6, "Batch50_PCGrad_global.yaml"),
    "npo_pcgrad": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "pcgrad", 8e-6, "Batch50_PCGrad_NPO.yaml"),
    "simnpo_pcgrad": ("simnpo", {"beta": 0.5, "delta": 0.1}, "nll", 0.5, 1.0, "pcgrad", 8e-6,
                      "Batch50_PCGrad_SimNPO.yaml"),
    "graddiff_sago": ("ga", {}, "nll", 1.0, 1.0, "sago", 1e-5, "Batch50_SAGO.yaml"),
    "npo_sago": ("npo", {"beta": 0.001}, "nll", 1.0, 1.0, "sago", 1e-5, "Batch50_SAGO_NPO.yaml"),
    "simnpo_sago": ("simnpo", {"beta": 0.1, "delta": 0.1}, "nll", 0.1, 1.0, "sago", 1e-5, "Batch50_SAGO_SimNPO.yaml"),
}
RWKU_LABEL = {"ga": "GA", "npo": "NPO", "simnpo": "SimNPO"}


def rwku_preset(name: str) -> tuple[str, dict]:
    """(header, config) of SAGO's RWKU Batch50 run `name` on Llama-3-8B-Instruct (4 processes, FSDP)."""
    forget, args, retain, alpha, gamma, rule, lr, file = RWKU[name]
    m: dict = {"forget": forget, "forget_args": dict(args), "retain": retain, "alpha": alpha, "gamma": gamma}
    if rule != "sum":
        m["combine"] = {"rule": rule}
    cfg = {"model": {"path": "meta-llama/Meta-Llama-3-8B-Instruct", "dtype": "float32"},
           "data": {"source": "data/rwku/Batch/1-50", "forget_split": "passage", "retain_split": "retain_passage",
                    "max_length": 512, "format": "text", "windows": "stream"},
           "method": m,
           "train": {"epochs": 2, "batch_size": 4, "grad_accum": 2, "lr": lr, "scheduler": "linear",
                     "warmup_ratio": 0.1, "weight_decay": 0.0, "max_grad_norm": None, "precision": "bf16",
                     "fsdp": True, "gradient_checkpointing": True},
           "eval": {"enabled": False}, "output_dir": f"runs/rwku-{name}"}
    label = ("GradDiff" if forget == "ga" else RWKU_LABEL[forget] + "+GD") if retain else RWKU_LABEL[forget]
    what = f"{label} with {RULE_LABEL[rule]}" if retain else f"{label} alone (no retain term)"
    header = _header([
        f"{what} on RWKU's first 50 targets (Llama-3-8B-Instruct; SAGO's RWKU batch setting).",
        f"Source: {RWKU_DIR}/{file} (lr {lr:g}, 2 epochs, warmup_ratio 0.1"
        + (f", alpha {alpha:g}, gamma {gamma:g}" if retain else "") + "".join(f", {k} {v:g}" for k, v in args.items()) + ").",
        f"Launch: global batch 32 = 4 per GPU x 2 accumulation x 4 processes ({SAGO_AT} scripts/rwku_unlearn.sh:17-19, "
        "rwku_baselines.sh:17-19); weight_decay 0 (configs/trainer/finetune.yaml:19); 512-token windows cut as "
        "src/data/pretraining.py does (data.windows stream).",
        "Precision: fp32 master weights, bf16 compute, sharded over the 4 processes (theirs: DeepSpeed ZeRO-3 with bf16, "
        "which keeps fp32 partitions); gradient checkpointing as the scripts set it. No clipping: their ZeRO-3 JSON has "
        "no gradient_clipping key (inferred from the libraries, not run).",
        "Data: run `obliviate prepare rwku --targets 50` first: data/rwku/Batch/1-50/passage.json = the original "
        "passages of RWKU's first 50 targets, retain_passage.json = those of the last 50 (setup_data.py:91-179).",
        "Differences, on purpose: torch AdamW on the shards (theirs: bitsandbytes paged AdamW 32-bit, the same update; "
        "bitsandbytes cannot take FSDP's shards); PCGrad projects per whole parameter tensor, across shards (under "
        "their ZeRO-3 it ran per local shard, and pcgrad_global per rank); the warm-up is int(0.1 x steps) (HF: ceil); "
        "each forget window meets a retain window drawn by the run's seed.",
        "Memory (estimate, not measured): 8.0B fp32 weights + gradients + AdamW = 128 GB"
        + (" + the frozen reference copy 32 GB" if forget == "npo" else "") + ", sharded: about "
        + f"{round((128 + 32 * (forget == 'npo')) / 4 + 8):d} GB per GPU with activations.",
        f"Run from the repository root: torchrun --nproc_per_node 4 $(which obliviate) unlearn --config configs/rwku/{name}.yaml",
        f"Then: obliviate eval --benchmark rwku --model runs/rwku-{name} --data data/rwku/Batch/1-50 "
        f"--out runs/rwku-{name}-eval model.dtype=bfloat16",
    ])
    return header, cfg


# ----------------------------------------------------------------------------- TOFU on a GPU, as published

# open-unlearning's published figures live in the package (obliviate reproduce reads them too).
PUBLISHED_1B = OPEN_UNLEARNING_TOFU_1B
GPU_METHODS = ("grad_ascent", "graddiff", "idk_dpo", "npo", "simnpo", "rmu", "asu_kl", "asu_gd")
HUB_1B = "open-unlearning/tofu_Llama-3.2-1B-Instruct"


def gpu_tofu_preset(name: str, split: str) -> tuple[str, dict]:
    """(header, config) of recipe `name` on TOFU forget`split` from open-unlearning's Llama-3.2-1B-Instruct target."""
    header, cfg = preset(name, "tofu")
    retain = f"{100 - int(split):02d}"
    cfg["model"] = {"path": f"{HUB_1B}_full", "dtype": "bfloat16", "chat": {"system": "You are a helpful assistant.",
                                                                          "template_args": {"date_string": "10 Apr 2025"}}}
    cfg["data"] = {**cfg["data"], "source": "locuslab/TOFU", "forget_split": f"forget{split}",
                   "retain_split": f"retain{retain}"}
    cfg["eval"] = {**cfg["eval"], "forget_split": f"forget{split}_perturbed", "retain_model": f"{HUB_1B}_retain{retain}",
                   "holdout_split": f"holdout{split}"}
    if cfg["method"]["forget"] == "rmu":
        cfg["method"]["forget_args"]["layer"] = 7
        cfg["method"]["retain_args"]["layer"] = 7
    cfg["output_dir"] = f"runs/gpu-tofu-1b-{name}-forget{split}"
    pub = PUBLISHED_1B.get(name, {}).get(split)
    fin, ret = PUBLISHED_1B["finetuned"][split], PUBLISHED_1B["retain"][split]
    if pub:
        published = (f"Published ({OU} docs/results.md, Llama-3.2-1B-Instruct, forget{split}): forget_quality {pub[0]}, "
                     f"model_utility {pub[1]}, forget_truth_ratio {pub[2]} (finetuned {fin[0]} / {fin[1]} / {fin[2]}; "
                     f"retain {ret[0]} / {ret[1]} / {ret[2]}).")
    else:
        published = (f"Published: no Llama-3.2-1B TOFU figures for this method are known to us (the ASU paper uses "
                     f"tau 2.0-2.8); the finetuned model scores {fin[0]} / {fin[1]} / {fin[2]} and the retain model "
                     f"{ret[0]} / {ret[1]} / {ret[2]} there (forget_quality / model_utility / forget_truth_ratio).")
    lines = [ln[2:] for ln in header.splitlines()[:3]] + [
        published,
        f"Prompt: {OU} configs/model/Llama-3.2-1B-Instruct.yaml template_args (system turn, date_string), as the "
        "model was fine-tuned and evaluated.",
        "Their runs: 2 x L40s, DeepSpeed ZeRO-3, paged AdamW 32-bit; here one GPU, torch AdamW: expect the digits to "
        "differ, not the picture. Memory (estimate, not measured): 1.24B bf16 parameters, gradients and AdamW state "
        "(kept in the parameters' dtype) about 10 GB + activations; a teacher/reference copy adds 2.5 GB.",
        f"Run from the repository root: obliviate unlearn --config configs/gpu/tofu_llama32_1b/{name}_forget{split}.yaml"]
    return _header(lines), cfg


# ----------------------------------------------------------------------------- ASU's own TOFU recipe, exactly

# TOFU rows per forget split (locuslab/TOFU; the copy shipped with obliviate holds the same counts).
TOFU_ROWS = {"01": 40, "05": 200, "10": 400}
ASU_TOFU = {  # name -> (description, retain term, retain_args)
    "asu_gd": ("ASU_GD as the ASU authors run it on TOFU (Right-to-be-forgotten scripts/tofu/asu.sh, ASU+GD)", "nll", {}),
    "asu_kl": ("ASU_KL with the paper's retain term (KL on answer tokens) and the authors' TOFU recipe", "kl", {}),
    "asu_kl_released": ("ASU_KL exactly as released: the authors' TOFU retain term, KL over every position of rows "
                        "padded to 500 tokens (batchmean)", "kl", {"positions": "max_length"}),
}


def asu_tofu_preset(name: str, split: str) -> tuple[str, dict]:
    """(header, config) of the ASU authors' TOFU run `name` on forget`split` (Llama-2-7B fine-tuned on TOFU)."""
    desc, retain, retain_args = ASU_TOFU[name]
    n = TOFU_ROWS[split]
    steps, per_epoch = 5 * n // 32, n // 32
    method = {"forget": "asu", "forget_args": {"tau": 2.3, "layers": None}, "retain": retain, "gamma": 0.1,
              "alpha": 1.0, **({"retain_args": retain_args} if retain_args else {})}
    cfg = {"model": {"path": "locuslab/tofu_ft_llama2-7b", "tokenizer": "NousResearch/Llama-2-7b-chat-hf",
                     "dtype": "float32", "chat": {"prompt_template": "[INST] {question} [/INST]"}},
           "data": {"source": "locuslab/TOFU", "forget_split": f"forget{split}",
                    "retain_split": f"retain{100 - int(split):02d}", "max_length": 500},
           "method": method,
           "train": {"epochs": 5, "max_steps": steps, "batch_size": 4, "grad_accum": 8, "lr": 1.0e-5,
                     "scheduler": "linear", "warmup_epochs": 1.0 if per_epoch > 1 else 0.0, "weight_decay": 0.01,
                     "max_grad_norm": 1.0, "precision": "bf16", "optimizer": "paged_adamw",
                     "gradient_checkpointing": True},
           "eval": {"forget_split": f"forget{split}_perturbed", "holdout_split": f"holdout{split}",
                    "retain_model": f"open-unlearning/tofu_Llama-2-7b-chat-hf_retain{100 - int(split):02d}",
                    "protocol": "closer_look"},
           "output_dir": f"runs/gpu-asu-tofu-llama2-{name}-forget{split}"}
    released = ("; retain term: the second `kl_loss` of trainer/losses.py (line 197), which shadows the first "
                "(line 161) in Python: every position of the padded rows, unshifted, batchmean (positions max_length)"
                if name == "asu_kl_released" else
                "; retain term: the paper's KL on answer tokens, i.e. the first, shadowed `kl_loss` of trainer/"
                "losses.py (line 161); `asu_kl_released` runs the one the code actually uses" if name == "asu_kl" else "")
    lines = [
        f"{desc}.",
        f"Source: {RTBF}/scripts/tofu/asu.sh:21-37 (tau 2.3, layers_id null = every layer, forget_coeff 0.1 = gamma, "
        f"regularization_coeff 1.0 = alpha, lr 1e-5, 5 epochs){released}.",
        f"Schedule: {RTBF}/forget.py:121-126: max_steps = 5 x {n} rows // 32 = {steps}, warm-up = one epoch's steps "
        f"({n} // 32 = {per_epoch}{'' if per_epoch > 1 else ', and none when an epoch is one step'}); effective batch "
        "32 (4 per GPU x 4 accumulation x 2 GPUs there; 4 x 8 on one GPU here); weight decay 0.01 (config/tofu.yaml:30); "
        "linear schedule (the Trainer's default); paged AdamW 32-bit (forget.py:160).",
        f"Data: rows of 500 tokens at most (forget.py:116); prompt '[INST] ' + q + ' [/INST]' + answer with BOS "
        f"({RTBF}/config/model_config.yaml:4-6, dataset/data_module.py:24-50); the tokenizer of "
        "NousResearch/Llama-2-7b-chat-hf (model_config.yaml:3); retain = the other TOFU authors (their retain pool for "
        "task 1, forget.py:41-48).",
        "Precision: fp32 master weights and optimizer state, bf16 compute (their bf16 + DeepSpeed ZeRO-3 keeps fp32 "
        "partitions); gradient checkpointing as model_config.yaml:8.",
        "Differences, on purpose: each forget row meets a retain row drawn by the run's seed (theirs: row i always "
        "meets one fixed retain row, data_module.py:108-109); NLL retain tokens pooled over the whole step (theirs: "
        "per micro-batch, then averaged); evaluation by closer-look's protocol with open-unlearning's Llama-2 retain "
        "model for forget quality (closer-look ships no retain model).",
        "Memory (estimate, not measured): 6.7B fp32 weights + gradients + paged AdamW ~108 GB (states page to the "
        "host under pressure), frozen teacher copy 27 GB, activations with checkpointing a few GB: one 141 GB GPU.",
        f"CPU twin: configs/twins/asu_tofu_llama2_7b/{name}_forget{split}.yaml (same recipe, the tiny TOFU target).",
        f"Run from the repository root: obliviate unlearn --config configs/gpu/asu_tofu_llama2_7b/{name}_forget{split}.yaml"]
    return _header(lines), cfg


def asu_continual_preset(name: str) -> tuple[str, dict]:
    """(header, config) of the ASU authors' continual TOFU run `name` (asu_gd | asu_kl): forget10 as ten forget01
    requests in order, each from the previous result, with its own 6-step schedule."""
    header, cfg = asu_tofu_preset(name, "01")
    cfg["data"] = {**cfg["data"], "forget_split": "forget10", "retain_split": "retain90"}
    cfg["continual"] = {"requests": 10}
    cfg["eval"] = {**cfg["eval"], "forget_split": "forget10_perturbed", "holdout_split": "holdout10",
                   "retain_model": "open-unlearning/tofu_Llama-2-7b-chat-hf_retain90"}
    cfg["output_dir"] = f"runs/gpu-asu-tofu-llama2-{name}-continual"
    lines = [ln[2:] for ln in header.splitlines()]
    lines[0] = lines[0].rstrip(".") + ", continual: forget10 as ten forget01 requests (tasks 1-10), in order."
    lines[1] = (f"Source: {RTBF}/scripts/continual_tofu/asu.sh:9-36 (task_list 1..10 of forget01, tau 2.3, layers_id "
                "null, forget_coeff 0.1, regularization_coeff 1.0, lr 1e-5, 5 epochs a task); fix_ref_model is left "
                "unset there, so each task's teacher and KL reference are the previous task's model (forget.py:170-172),"
                " which is obliviate's continual rule (docs/METHODS.md §1.5).")
    lines[2] = (f"Schedule: {RTBF}/forget.py:121-126 per task: 5 x 40 rows // 32 = 6 steps, no warm-up (one step an "
                "epoch); effective batch 32; weight decay 0.01; linear; paged AdamW 32-bit.")
    lines.insert(6, "Also different: the retain set is retain90 for every request (theirs: retain90 plus the forget01 "
                    "tasks not yet unlearned, forget.py:41-48), so no request trains on a later request's rows.")
    lines[-2] = f"CPU twin: configs/twins/asu_tofu_llama2_7b/{name}_continual_forget01.yaml (same recipe, the tiny TOFU target)."
    lines[-1] = f"Run from the repository root: obliviate unlearn --config configs/gpu/asu_tofu_llama2_7b/{name}_continual_forget01.yaml"
    return _header(lines), cfg


def cpu_twin(header: str, cfg: dict, family: str, name: str) -> tuple[str, dict]:
    """The CPU-sized twin of a GPU preset: the same recipe (method, schedule, data splits, prompt) on the tiny TOFU
    target of configs/tofu/finetune_target_tiny.yaml and the TOFU copy shipped with obliviate, in float32 with
    torch's AdamW and no GPU-only switches."""
    twin = {**cfg, "model": {**cfg["model"], "path": "runs/tofu-target-tiny", "dtype": "float32"},
            "data": {**cfg["data"], "source": "tofu"},
            "train": {k: v for k, v in cfg["train"].items()
                      if k not in ("precision", "optimizer", "gradient_checkpointing")},
            "eval": {**cfg["eval"], "protocol": "tofu",  # the tiny retain model holds retain99: forget01's twin
                     "retain_model": "runs/tofu-retain99-tiny" if cfg["data"]["retain_split"] == "retain99" else None},
            "output_dir": f"runs/twin-{family}-{name}"}
    twin["model"].pop("tokenizer", None)
    rmu = twin["method"]["forget"] == "rmu"
    if rmu:  # the tiny target has 4 layers: RMU at layer 2, as configs/tofu/rmu.yaml
        twin["method"] = {**twin["method"], "forget_args": {**twin["method"]["forget_args"], "layer": 2},
                          "retain_args": {**twin["method"]["retain_args"], "layer": 2}}
    first = header.splitlines()[0][2:]
    source = next(ln[2:] for ln in header.splitlines() if ln.startswith("# Source: "))
    lines = [f"CPU twin of configs/gpu/{family}/{name}.yaml: {first}", source,
             "Same method, schedule, splits and prompt; the model is the tiny TOFU target (build it first: obliviate "
             "finetune --config configs/tofu/finetune_target_tiny.yaml, and the retain model with "
             "finetune_retain99_tiny.yaml), float32, torch AdamW, evaluated by the TOFU protocol"
             + ("; RMU at layer 2 of its 4." if rmu else "."),
             f"Run from the repository root: obliviate unlearn --config configs/twins/{family}/{name}.yaml"]
    return _header(lines), twin


def muse_books_asu(name: str) -> tuple[str, dict]:
    """ASU on MUSE-Books as the ASU authors' open-unlearning script sets it (tau 2.35, forget weight 0.001)."""
    header, cfg = preset(name, "muse")
    cfg["model"] = {"path": "muse-bench/MUSE-Books_target"}
    cfg["data"] = {**cfg["data"], "source": "muse-bench/MUSE-Books"}
    cfg["method"] = {**cfg["method"], "forget_args": {"tau": 2.35, "layers": None}, "gamma": 0.001}
    cfg["muse"] = {"source": "muse-bench/MUSE-Books", "retrain_model": "muse-bench/MUSE-Books_retrain"}
    cfg["output_dir"] = f"runs/muse-books-{name}"
    lines = [ln[2:] for ln in header.splitlines()]
    lines[0] = lines[0].rstrip(".") + ", on MUSE-Books."
    lines[1] = (f"Source: {ASU_SRC}; MUSE-Books: {ASU_OU}/scripts/muse_unlearn.sh:134-135 (alpha 0.001, the FORGET "
                "weight in src/trainer/unlearn/ASU.py:102 = our gamma; tau 2.35).")
    lines[3] = "On MUSE-Books raw text (hub) from MUSE's Books target model; evaluated with VerbMem / KnowMem / PrivLeak."
    lines[-1] = f"Run from the repository root: obliviate unlearn --config configs/muse/{name}_books.yaml"
    return _header(lines), cfg


def write(path: Path, header: str, cfg: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None), encoding="utf-8")


def main(root: Path | None = None) -> int:
    """Write every preset under `root` (default: the repository's configs/); returns how many."""
    root = root or Path(__file__).resolve().parents[1] / "configs"
    count = 0
    for target in TARGETS:
        for name in METHODS:
            if name not in TARGETS[target].get("skip", ()):
                write(root / target / f"{name}.yaml", *preset(name, target))
                count += 1
    for key in wmdp_names():
        write(root / "wmdp" / f"{'_'.join(key)}.yaml", *wmdp_preset(*key))
        count += 1
    for name in RWKU:
        write(root / "rwku" / f"{name}.yaml", *rwku_preset(name))
        count += 1
    for name in GPU_METHODS:
        for split in ("01", "05", "10"):
            header, cfg = gpu_tofu_preset(name, split)
            write(root / "gpu" / "tofu_llama32_1b" / f"{name}_forget{split}.yaml", header, cfg)
            write(root / "twins" / "tofu_llama32_1b" / f"{name}_forget{split}.yaml",
                  *cpu_twin(header, cfg, "tofu_llama32_1b", f"{name}_forget{split}"))
            count += 2
    for name in ASU_TOFU:
        for split in TOFU_ROWS:
            header, cfg = asu_tofu_preset(name, split)
            write(root / "gpu" / "asu_tofu_llama2_7b" / f"{name}_forget{split}.yaml", header, cfg)
            write(root / "twins" / "asu_tofu_llama2_7b" / f"{name}_forget{split}.yaml",
                  *cpu_twin(header, cfg, "asu_tofu_llama2_7b", f"{name}_forget{split}"))
            count += 2
    for name in ("asu_gd", "asu_kl"):
        write(root / "muse" / f"{name}_books.yaml", *muse_books_asu(name))
        header, cfg = asu_continual_preset(name)
        stem = f"{name}_continual_forget01"
        write(root / "gpu" / "asu_tofu_llama2_7b" / f"{stem}.yaml", header, cfg)
        write(root / "twins" / "asu_tofu_llama2_7b" / f"{stem}.yaml", *cpu_twin(header, cfg, "asu_tofu_llama2_7b", stem))
        count += 3
    return count


if __name__ == "__main__":
    print(f"wrote {main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)} presets")
