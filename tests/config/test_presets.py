"""Every shipped preset loads with obliviate's config loader, names registered components, cites its
source, and equals what scripts/make_presets.py writes (so nobody hand-edits a generated file)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from obliviate.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
GENERATED = ("tofu", "synthetic", "muse", "wmdp", "gpu/tofu_llama32_1b", "gpu/asu_tofu_llama2_7b",
             "twins/asu_tofu_llama2_7b", "twins/tofu_llama32_1b")


def _command(path: Path) -> str:
    """The CLI command a config file is written for (as `obliviate validate`/`unlearn`/... would load it)."""
    if path.parent == CONFIGS and path.stem.startswith("demo"):
        return "demo"
    if path.parent.name == "sweep":
        return "sweep"
    return "finetune" if path.stem.startswith("finetune") else "unlearn"


def _make_presets():
    spec = importlib.util.spec_from_file_location("make_presets", ROOT / "scripts" / "make_presets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ALL = sorted(CONFIGS.rglob("*.yaml"))
UNLEARN = [p for p in ALL if _command(p) == "unlearn"]


def test_presets_exist() -> None:
    assert {str(p.parent.relative_to(CONFIGS)) for p in UNLEARN} >= set(GENERATED)
    # RMU / NPO / SimNPO x sum / PCGrad / SAGO x bio / cyber, and GradDiff x sum / SAGO / PCGrad / global PCGrad x 2
    assert len(list((CONFIGS / "wmdp").glob("*.yaml"))) == 18 + 8


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_yaml_loads(path: Path) -> None:
    from obliviate.cli.configured import config_class

    load_config(config_class(_command(path), str(path)), path)


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_validate_reads_every_shipped_config_as_the_command_it_is_for(path: Path) -> None:
    from obliviate.cli import parser
    from obliviate.cli.configured import command_class, config_class

    ns = parser().parse_args(["validate", "--config", str(path)])
    assert command_class(ns) is config_class(_command(path), str(path))


@pytest.mark.parametrize("path", UNLEARN, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_methods_name_registered_components(path: Path) -> None:
    """Names only: hyper-parameter keys are checked by `obliviate validate` (resolve_method)."""
    from obliviate.gradients import RULES
    from obliviate.objectives import FORGET, RETAIN

    method = load_config(RunConfig, path).method
    assert method.forget in FORGET.names()
    assert method.retain is None or method.retain in RETAIN.names()
    assert method.combine.rule in RULES.names()


# Sweeps whose base reads what earlier commands make (prepared data, fine-tuned models): their whole check runs in
# tests/cli/test_validate_presets.py, from a folder laid out as after those commands.
AFTER_EARLIER_COMMANDS = {"smollm2_tofu20.yaml": "needs data/tofu-20 and the TOFU-20 target and retain models",
                          "smollm2_tofu20_rmu.yaml": "the same (and one method: RMU over a wider learning rate)",
                          "smollm2_tofu20_forget05.yaml": "the same, with the retain95 model (a transfer study)",
                          "smollm2_tofu20_forget05_asu_floor.yaml": "the same (ASU at two fixed points)",
                          "smollm2_tofu20_forget05_search.yaml": "the same, with the retain95 model (a search)"}


@pytest.mark.parametrize("path", [p for p in ALL if _command(p) == "sweep" and p.name not in AFTER_EARLIER_COMMANDS],
                         ids=lambda p: p.name)
def test_every_sweep_passes_its_whole_check(path: Path, monkeypatch) -> None:
    """The base, the methods, every dimension at both ends, the objectives and the bar (no model loaded); a
    transfer study (each method at one chosen point) has no dimensions, every other sweep searches some."""
    from obliviate.sweep.config import SweepConfig
    from obliviate.sweep.run import plan_sweep

    monkeypatch.chdir(ROOT)
    plan = plan_sweep(load_config(SweepConfig, path))
    assert len(plan.methods) >= 3 and plan.objectives
    assert bool(plan.dims) == ("transfer" not in path.stem), "a search space, except in a transfer study"


def test_the_tofu20_sweep_starts_each_method_at_its_preset() -> None:
    """configs/sweep/smollm2_tofu20.yaml: each method's section, and the base's training settings with the method's
    own `train`, are those of its preset in configs/tofu/smollm2/ (the authors' recipe scaled to SmolLM2), so the
    sweep's first trial of each method (start_at_recipe) is that preset."""
    from obliviate.config import MethodConfig, TrainConfig, build, to_dict
    from obliviate.config.loader import read_yaml

    sweep = read_yaml(CONFIGS / "sweep" / "smollm2_tofu20.yaml")
    assert sweep["start_at_recipe"] is True
    base = read_yaml(ROOT / sweep["base"])
    presets = {"ASU_KL": "asu_kl", "ASU_GD": "asu_gd", "GradDiff": "graddiff", "NPO": "npo", "NPO+SAGO": "npo_sago",
               "SimNPO": "simnpo", "SimNPO+SAGO": "simnpo_sago", "IdkDPO": "idk_dpo", "RMU": "rmu"}
    assert set(sweep["methods"]) == set(presets)
    for name, file in presets.items():
        preset = read_yaml(CONFIGS / "tofu" / "smollm2" / f"{file}.yaml")
        raw = dict(sweep["methods"][name])
        own = raw.pop("train", {})
        assert to_dict(build(MethodConfig, raw)) == to_dict(build(MethodConfig, preset["method"])), name
        train = {**base["train"], **sweep["set"].get("train", {}), **own}
        assert to_dict(build(TrainConfig, train)) == to_dict(build(TrainConfig, preset["train"])), name
        assert {k: v for k, v in preset.items() if k not in ("method", "train", "output_dir")} == \
            {k: v for k, v in base.items() if k not in ("method", "train", "output_dir")}, name


@pytest.mark.parametrize("target", GENERATED)
def test_generated_presets_cite_a_source_and_are_current(target: str, tmp_path: Path) -> None:
    _make_presets().main(tmp_path)
    written = sorted(p.name for p in (tmp_path / target).glob("*.yaml"))
    shipped = sorted(p.name for p in (CONFIGS / target).glob("*.yaml") if not p.stem.startswith("finetune"))
    assert written == shipped
    for name in written:
        text = (tmp_path / target / name).read_text(encoding="utf-8")
        assert text == (CONFIGS / target / name).read_text(encoding="utf-8"), f"rerun scripts/make_presets.py ({name})"
        assert any(line.startswith("# Source: ") for line in text.splitlines()), name


def test_wmdp_presets_are_runnable_as_written() -> None:
    """Zephyr-7B in bf16 on 512-token windows of the WMDP corpora; RMU trains WMDP's layers at layer 7."""
    for path in sorted((CONFIGS / "wmdp").glob("*.yaml")):
        cfg = load_config(RunConfig, path)
        corpus = path.stem.rsplit("_", 1)[1]
        assert cfg.model.path == "HuggingFaceH4/zephyr-7b-beta" and cfg.model.dtype == "bfloat16"
        assert cfg.data.format == "text" and cfg.data.max_length == 512
        assert cfg.data.forget_split.startswith(f"{corpus}-forget-corpus")
        assert cfg.data.retain_split.startswith(f"{corpus}-retain-corpus")
        assert cfg.train.max_steps and cfg.train.batch_size * cfg.train.grad_accum == 32
        assert cfg.method.combine.rule == path.stem.split("_", 1)[1].rsplit("_", 1)[0]
        assert cfg.data.windows == "stream"
        if cfg.method.forget == "rmu":
            assert cfg.method.forget_args["layer"] == cfg.method.retain_args["layer"] == 7
            assert cfg.method.forget_args["trainable_params"] == "wmdp"


def test_gpu_tofu_presets_name_the_published_models_and_numbers() -> None:
    """open-unlearning's Llama-3.2-1B TOFU target and retain twins, forget01/05/10, and its published figures."""
    for path in sorted((CONFIGS / "gpu" / "tofu_llama32_1b").glob("*.yaml")):
        cfg = load_config(RunConfig, path)
        split = path.stem.rsplit("forget", 1)[1]
        assert cfg.model.path == "open-unlearning/tofu_Llama-3.2-1B-Instruct_full"
        assert cfg.data.source == "locuslab/TOFU" and cfg.data.forget_split == f"forget{split}"
        assert cfg.eval.retain_model == f"open-unlearning/tofu_Llama-3.2-1B-Instruct_retain{100 - int(split):02d}"
        assert cfg.train.batch_size * cfg.train.grad_accum == 32 and cfg.train.lr == 1e-5 and cfg.train.epochs == 10
        if cfg.method.forget == "asu":
            assert cfg.method.forget_args == {"tau": 2.0, "layers": None}
        if cfg.method.forget == "rmu":
            assert cfg.method.forget_args["layer"] == 7
    text = (CONFIGS / "gpu" / "tofu_llama32_1b" / "npo_forget01.yaml").read_text(encoding="utf-8")
    assert "forget_quality 0.92, model_utility 0.56, forget_truth_ratio 0.66" in text  # docs/results.md, by hand
    text = (CONFIGS / "gpu" / "tofu_llama32_1b" / "graddiff_forget10.yaml").read_text(encoding="utf-8")
    assert "forget_quality 1.06e-239, model_utility 0.49" in text
