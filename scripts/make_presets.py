"""Write the method presets in configs/tofu/ and configs/synthetic/ (complete YAMLs, no includes).

Run from the repository root after changing a preset here: python scripts/make_presets.py
"""
from __future__ import annotations

from pathlib import Path

import yaml

# name: (description, method section); METHODS.md §1-3 defaults, SAGO-paper weights for the rule presets
METHODS = {
    "grad_ascent": ("GradAscent: gradient ascent on the forget set, no retain term", {"forget": "ga", "retain": None}),
    "graddiff": ("GradDiff: gradient ascent + NLL on retain", {"forget": "ga", "retain": "nll"}),
    "npo": ("NPO (beta 0.1) + NLL on retain", {"forget": "npo", "forget_args": {"beta": 0.1}, "retain": "nll"}),
    "simnpo": ("SimNPO (beta 4.5, delta 0, gamma 0.125) + NLL on retain",
               {"forget": "simnpo", "forget_args": {"beta": 4.5, "delta": 0.0}, "retain": "nll", "gamma": 0.125}),
    "idk_dpo": ("IdkDPO: DPO with a refusal as the preferred answer + NLL on retain",
                {"forget": "idk_dpo", "forget_args": {"beta": 0.1}, "retain": "nll"}),
    "idk_ap": ("IDK+AP: NLL of a refusal + answer preservation on retain", {"forget": "idk", "retain": "ap"}),
    "me_gd": ("ME+GD: maximum entropy on forget (gamma 0.1) + NLL on retain",
              {"forget": "me", "retain": "nll", "gamma": 0.1}),
    "undial": ("UNDIAL: self-distillation to reference logits with the gold token lowered (beta 10)",
               {"forget": "undial", "forget_args": {"beta": 10.0}, "retain": None}),
    "rmu": ("RMU: steer layer-L hidden states of forget text to c·u, keep retain hidden states (alpha 1200); "
            "trains layers L-2..L only", {"forget": "rmu", "retain": "hidden_mse", "alpha": 1200.0}),
    "asu_gd": ("ASU_GD: attention-smoothing distillation + NLL on retain", {"forget": "asu", "retain": "nll"}),
    "asu_kl": ("ASU_KL: attention-smoothing distillation + KL to the original model on retain",
               {"forget": "asu", "retain": "kl"}),
    "simnpo_sago": ("SimNPO+GD with SAGO (SAGO paper: alpha 0.1, gamma 1, beta 0.02)",
                    {"forget": "simnpo", "forget_args": {"beta": 0.02, "delta": 0.0}, "retain": "nll",
                     "alpha": 0.1, "gamma": 1.0, "combine": {"rule": "sago"}}),
    "npo_pcgrad": ("NPO+GD with module-wise PCGrad (SAGO paper: alpha 1, gamma 0.1)",
                   {"forget": "npo", "forget_args": {"beta": 0.1}, "retain": "nll", "alpha": 1.0, "gamma": 0.1,
                    "combine": {"rule": "pcgrad"}}),
    "asu_sago": ("ASU_GD with SAGO (retention first on conflicting coordinates)",
                 {"forget": "asu", "retain": "nll", "combine": {"rule": "sago"}}),
}

TARGETS = {
    "tofu": {
        "note": "TOFU forget01 (local files) from the target of configs/tofu/finetune_target_tiny.yaml; for a "
                "published TOFU model pass model.path=<hub id> eval.retain_model=<its retain99 twin>; "
                "for the hub data pass data.source=locuslab/TOFU.",
        "model": {"path": "runs/tofu-target-tiny"},
        "data": {"source": "../shared/data/tofu", "forget_split": "forget01", "retain_split": "retain99",
                 "max_length": 256},
        "train": {"epochs": 10, "batch_size": 8, "grad_accum": 4, "lr": 1.0e-5, "scheduler": "linear",
                  "warmup_ratio": 0.1, "weight_decay": 0.01},
        "eval": {"forget_split": "forget01_perturbed", "retain_model": "runs/tofu-retain99-tiny"},
        "asu_args": {"tau": 2.0, "layers": None},
        "rmu_layer": 2, "rmu_coef": 2.0,  # the tiny 4-layer target; WMDP's 7B recipe: layer 7, c 6.5
    },
    "synthetic": {
        "note": "the demo's synthetic world and target model (run `obliviate demo` first); forget10 = 2 authors.",
        "model": {"path": "obliviate-demo/models/target"},
        "data": {"source": "obliviate-demo/world", "forget_split": "forget10", "retain_split": "retain90",
                 "max_length": 96},
        "train": {"epochs": 20, "batch_size": 8, "lr": 1.0e-3, "scheduler": "constant", "weight_decay": 0.0},
        "eval": {"forget_split": "forget10_perturbed", "retain_model": "obliviate-demo/models/retain",
                 "batch_size": 32},
        "asu_args": {"tau": 16.0, "layers": [0]},
        "rmu_layer": 1, "rmu_coef": 2.0,  # the demo's 2-layer model
    },
    "muse": {
        "note": "MUSE-News raw text (hub; a local copy in the hub layout works too) from MUSE's target model; "
                "evaluated with VerbMem / KnowMem / PrivLeak. Needs a GPU in practice (2048-token windows, 7B).",
        "model": {"path": "muse-bench/MUSE-news_target"},
        "data": {"source": "muse-bench/MUSE-News", "forget_split": "raw/forget", "retain_split": "raw/retain1",
                 "max_length": 2048, "format": "text"},
        "train": {"epochs": 10, "batch_size": 4, "grad_accum": 8, "lr": 1.0e-5, "scheduler": "constant",
                  "weight_decay": 0.0},
        "eval": {"enabled": True},
        "muse": {"source": "muse-bench/MUSE-News", "retrain_model": "muse-bench/MUSE-news_retrain"},
        "asu_args": {"tau": 2.0, "layers": None},
        "rmu_layer": 7, "rmu_coef": 6.5,
        "skip": ("idk_dpo", "idk_ap"),  # refusals answer questions; MUSE trains on raw text
    },
}


def preset(name: str, target: str) -> tuple[str, dict]:
    desc, method = METHODS[name]
    t = TARGETS[target]
    method = {**method}
    if method["forget"] == "asu":
        method["forget_args"] = dict(t["asu_args"])
    if method["forget"] == "rmu":
        method["forget_args"] = {"layer": t["rmu_layer"], "steering_coef": t["rmu_coef"]}
        method["retain_args"] = {"layer": t["rmu_layer"]}
    cfg = {"model": t["model"], "data": t["data"], "method": method, "train": t["train"], "eval": t["eval"],
           **({"muse": t["muse"]} if "muse" in t else {}), "output_dir": f"runs/{target}-{name}"}
    header = (f"# {desc}.\n# On {t['note']}\n"
              f"# Run from the repository root: obliviate unlearn --config configs/{target}/{name}.yaml\n")
    return header, cfg


def main() -> None:
    root = Path(__file__).resolve().parents[1] / "configs"
    for target in TARGETS:
        for name in METHODS:
            if name in TARGETS[target].get("skip", ()):
                continue
            header, cfg = preset(name, target)
            path = root / target / f"{name}.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(header + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None))
    print(f"wrote {sum(len(METHODS) - len(t.get('skip', ())) for t in TARGETS.values())} presets")


if __name__ == "__main__":
    main()
