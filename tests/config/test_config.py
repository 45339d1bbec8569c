"""Config: YAML + overrides, unknown keys and impossible values are errors that name the fix."""
import pytest

from obliviate.config import RunConfig, apply_overrides, load_config
from obliviate.errors import ConfigError
from obliviate.setups.world import DemoConfig


def test_overrides_parse_types_and_nested_sections():
    cfg = load_config(RunConfig, None, ["train.lr=2e-5", "method.forget_args={tau: 3, layers: [0]}", "eval.max_examples=5"])
    assert cfg.train.lr == 2e-5 and cfg.method.forget_args == {"tau": 3, "layers": [0]} and cfg.eval.max_examples == 5


def test_eval_batch_size_is_auto_or_rows():
    assert load_config(RunConfig, None, []).eval.rows is None  # auto by default
    assert load_config(RunConfig, None, ["eval.batch_size=24"]).eval.rows == 24


def test_yaml_file_and_override_precedence(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-4\n  epochs: 2\nmethod:\n  forget: ga\n")
    cfg = load_config(RunConfig, p, ["train.epochs=3"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.method.forget) == (1e-4, 3.0, "ga")


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", r"unknown key\(s\) \['train.lrr'\]; valid keys under train: \[.*'lr'"),
    ("train.lr=abc", "train.lr: expected float"),
    ("train.batch_size=0", "train.batch_size=0 is impossible: it must be >= 1"),
    ("train.scheduler=wiggly", "one of linear"),
    ("nosuchsection.a=1", "unknown key"),
    ("train.lr", "must look like key.sub=value"),
    ("eval.batch_size=0", "eval.batch_size=0 is impossible: it must be auto or a number of rows >= 1"),
    ("eval.batch_size=big", "eval.batch_size='?big'? is impossible: it must be auto or a number"),
])
def test_bad_overrides_are_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RunConfig, None, [override])


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(RunConfig, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(RunConfig, bad)


def test_section_defaults_differ_per_field_and_overrides_edit_one_entry():
    cfg = load_config(DemoConfig, None, ["methods.ASU_KL.forget_args={tau: 5.0}", "unlearn.lr=3e-4"])
    methods = cfg.method_configs()
    assert methods["ASU_KL"].forget == "asu" and methods["ASU_KL"].forget_args == {"tau": 5.0}
    assert methods["GradDiff"].forget == "ga" and methods["GradDiff"].retain == "nll"
    assert cfg.unlearn.lr == 3e-4 and cfg.retain_train.lr == 3e-3  # per-section defaults kept
    with pytest.raises(ConfigError, match=r"methods.GradDiff.combine.rul"):
        load_config(DemoConfig, None, ["methods.GradDiff.combine.rul=sago"])


def test_apply_overrides_does_not_mutate_input():
    raw = {"train": {"lr": 1.0}}
    apply_overrides(raw, ["train.lr=2.0"])
    assert raw == {"train": {"lr": 1.0}}


def test_shipped_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    from obliviate.cli.configured import config_class

    files = sorted(root.rglob("*.yaml"))
    assert files, "configs/ must hold recipes"
    for f in files:
        kind = "demo" if f.stem.startswith("demo") else ("finetune" if "finetune" in f.stem else "unlearn")
        kind = "sweep" if f.parent.name == "sweep" else kind
        load_config(config_class(kind, str(f)), f)
    presets = {p.stem for p in (root / "synthetic").glob("*.yaml")}
    assert presets == {p.stem for p in (root / "tofu").glob("*.yaml") if "finetune" not in p.stem}
    books = {"asu_gd_books", "asu_kl_books"}  # ASU on MUSE-Books at its authors' tau and forget weight
    assert {p.stem for p in (root / "muse").glob("*.yaml")} == (presets - {"idk_dpo", "idk_ap"}) | books


def test_demo_yaml_spells_out_the_builtin_defaults():
    """configs/demo.yaml must equal DemoConfig's defaults, so the README's numbers match either way."""
    from pathlib import Path

    from obliviate.config import to_dict

    path = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert to_dict(load_config(DemoConfig, path)) == to_dict(load_config(DemoConfig, None))


def test_overrides_keep_the_order_of_mappings():
    """Methods run (and are tabled) in the YAML's order, with or without command-line overrides."""
    from pathlib import Path

    from obliviate.setups.knowledge import KnowledgeDemoConfig

    path = Path(__file__).resolve().parents[2] / "configs" / "demo_real.yaml"
    plain = list(load_config(KnowledgeDemoConfig, path).methods)
    assert plain[:2] == ["ASU_KL_tau2", "ASU_KL_calibrated"]
    assert list(load_config(KnowledgeDemoConfig, path, ["output_dir=x"]).methods) == plain
