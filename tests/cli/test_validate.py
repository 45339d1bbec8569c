"""`obliviate validate` accepts every config some command accepts (demos, finetune, eval, calibrate, unlearn),
finds the command from the file's keys, and rejects exactly what that command's own pre-flight rejects."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from obliviate.cli import main, parser
from obliviate.cli.configured import command_class, config_class

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


@pytest.mark.parametrize("text, command", [
    ("benchmark: mcq\nmcq: {source: x.jsonl}\nmodel: {path: m}\n", "eval"),
    ("source: tofu\nsplit: forget01\ntaus: [2, 3]\nmodel: {path: m}\n", "calibrate"),
    ("model: {path: m}\noutput_dir: runs/x\n", "unlearn"),  # fits several: unlearn, as before
    # the same sections, told apart by a key inside one: data.splits is finetune's, data.forget_split unlearn's
    ("model: {path: m}\ndata: {source: d, splits: [full]}\ntrain: {epochs: 2}\noutput_dir: x\n", "finetune"),
    ("model: {path: m}\ndata: {source: d, forget_split: f}\ntrain: {epochs: 2}\noutput_dir: x\n", "unlearn"),
])
def test_the_command_is_told_by_the_keys(tmp_path, text, command):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    assert command_class(parser().parse_args(["validate", "--config", str(f)])) is config_class(command)
    assert command_class(parser().parse_args(["validate", "--config", str(f), "--as", "finetune"])) is \
        config_class("finetune")


def test_the_synthetic_demo_config_validates(capsys):
    assert main(["validate", "--config", str(CONFIGS / "demo.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid (demo config):") and "method ASU_KL: asu + kl, rule sum" in out


def _tiny_model(tmp_path, small_tok):
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama

    d = tmp_path / "model"
    save_model(d, tiny_llama(small_tok, hidden_size=32, num_layers=2, seed=0), small_tok)
    return d


def test_the_real_model_demo_config_validates_as_the_demo_checks_it(tmp_path, small_tok, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = _tiny_model(tmp_path, small_tok)
    args = ["--config", str(CONFIGS / "demo_real.yaml"), f"model.path={model}"]
    assert main(["validate", *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("valid (demo (knowledge) config):") and "forget capitals" in out
    assert "tau: auto is calibrated first" in out
    bad = [*args, "knowledge.forget_families=[kapitals]"]
    assert main(["validate", *bad]) == 2
    v_err = capsys.readouterr().err
    assert "knowledge.forget_families: unknown families ['kapitals']" in v_err
    assert main(["demo", *bad, "output_dir=out"]) == 2  # the demo refuses it the same way, before loading anything
    assert capsys.readouterr().err == v_err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, extra, expect", [
    ("finetune", ["data.splits=[fulll]"], "no split 'fulll' in the shipped tofu data"),
    ("finetune", ["model.path=no/such/dir/here"], "model.path"),
    ("eval", ["eval.forget_split=nope_perturbed"], "no split 'nope_perturbed'"),
])
def test_validate_and_the_command_reject_the_same_input(tmp_path, capsys, monkeypatch, command, extra, expect):
    monkeypatch.chdir(tmp_path)
    if command == "finetune":
        args = ["--config", str(CONFIGS / "tofu" / "finetune_target_tiny.yaml"), *extra, "output_dir=out"]
    else:
        f = tmp_path / "eval.yaml"
        f.write_text(json.dumps({"benchmark": "tofu", "model": {"path": str(tmp_path)}, "eval": {"source": "tofu"}}))
        args = ["--config", str(f), *extra, "output_dir=out"]
    assert main(["validate", *args]) == 2
    v_err = capsys.readouterr().err
    assert expect in v_err
    assert main([command, *args]) == 2
    assert capsys.readouterr().err == v_err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, expect", [
    (["demo", "cpu_kernels=avx512"], "cpu_kernels='avx512' is impossible: it must be avx2 or native"),
    (["demo", "--config", str(CONFIGS / "demo_real.yaml"), "knowledge.max_per_family=0"],
     "knowledge.max_per_family=0 is impossible: it must be >= 1 or null"),
])
def test_the_new_demo_keys_refuse_impossible_values(tmp_path, capsys, monkeypatch, args, expect):
    monkeypatch.chdir(tmp_path)
    for command in (args, ["validate", *args[1:]]):
        assert main([*command, "output_dir=out"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("obliviate: error: ") and expect in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_validate_as_an_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "--as", "train", "--config", str(CONFIGS / "demo.yaml")])
    assert exc.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


def test_a_sweep_files_base_and_teacher_map_are_found_from_its_own_folder(tmp_path, monkeypatch, capsys):
    """`base: configs/demo.yaml` and a teacher map under docs/ are written from the repository root; validating
    the sweep file from any other folder still finds them (from the sweep file's folder up)."""
    from pathlib import Path

    from obliviate.cli import main

    root = Path(__file__).resolve().parents[2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["validate", "--offline", "--config", str(root / "configs" / "sweep" / "demo.yaml")]) == 0
    assert f"base: {root / 'configs' / 'demo.yaml'}" in capsys.readouterr().out
    heldout = root / "configs" / "sweep" / "smollm2_capitals_heldout.yaml"
    assert main(["validate", "--offline", "--config", str(heldout)]) == 0
    assert "method.forget_args (choices for ASU)" in capsys.readouterr().out
    stray = tmp_path / "stray.yaml"  # a base that exists nowhere is still named as written
    stray.write_text("base: configs/nowhere.yaml\nspace: {train.lr: {float: [1.0e-5, 1.0e-4]}}\n")
    assert main(["validate", "--offline", "--config", str(stray)]) == 2
    assert "configs/nowhere.yaml" in capsys.readouterr().err


def test_layers_the_real_model_lacks_are_caught_before_and_after_conversion(tmp_path, monkeypatch, capsys):
    """configs/demo_real.yaml with ASU on layer 40 of the 30-layer SmolLM2: refused from the GGUF header alone (an
    empty cache: nothing converted), and from the converted config.json, which says the same count."""
    from pathlib import Path

    from obliviate.cli import main
    from obliviate.modeling import gguf
    from obliviate.modeling.sources import model_config

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("OBLIVIATE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(root)
    assert model_config("smollm2-135m-instruct") == {"num_hidden_layers": 30}
    assert gguf.header_layers(tmp_path / "missing.gguf") is None
    args = ["validate", "--config", "configs/demo_real.yaml", "methods.ASU_KL_tau2.forget_args.layers=[40]"]
    assert main(args) == 2
    assert "methods.ASU_KL_tau2: method.forget_args.layers=[40]: layer index 40 is out of range for this model, " \
           "which has 30 layers" in capsys.readouterr().err
    assert main(args[:3]) == 0 and ", 30 layers" in capsys.readouterr().out
    assert not (tmp_path / "empty-cache").exists() or not any((tmp_path / "empty-cache").rglob("*.safetensors"))
