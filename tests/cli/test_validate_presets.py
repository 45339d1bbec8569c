"""Every config under configs/ passes `obliviate validate --offline`: no hub access (hub models, tokenizers and data
sets are named and every check that needs them is listed as skipped), everything else checked, from a folder laid
out as a user's would be after the presets' own first steps: the tiny TOFU target and retain model in runs/, the
demo's world and models in obliviate-demo/, WMDP's bio corpora at data/wmdp/wmdp-corpora, RWKU's batch at
data/rwku/Batch/1-50 (written by `obliviate prepare rwku`), TOFU's last 20 authors at data/tofu-20 (`obliviate
prepare tofu`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from obliviate.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, small_tok, rwku_source) -> Path:
    """A user's folder: runs/tofu-{target,retain99}-tiny (4 layers, as the tiny TOFU target), runs/tofu20-smollm2-* (30
    layers, as SmolLM2-135M), the demo's world and
    models, two small WMDP bio corpora, and configs/ (sweeps name their base config by a relative path)."""
    from obliviate.data.synthetic import make_world, write_world
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama

    root = tmp_path_factory.mktemp("user")
    model = tiny_llama(small_tok, hidden_size=16, num_layers=4, num_heads=2, seed=0)
    for name in ("runs/tofu-target-tiny", "runs/tofu-retain99-tiny", "obliviate-demo/models/target",
                 "obliviate-demo/models/retain"):
        save_model(root / name, model, small_tok)
    deep = tiny_llama(small_tok, hidden_size=16, num_layers=30, num_heads=2, seed=0)  # SmolLM2-135M's 30 layers
    for name in ("runs/tofu20-smollm2-target", "runs/tofu20-smollm2-retain90", "runs/tofu20-smollm2-retain95"):
        save_model(root / name, deep, small_tok)
    write_world(make_world(10, seed=0, forget_percents=(10,)), root / "obliviate-demo" / "world")
    corpora = root / "data" / "wmdp" / "wmdp-corpora"
    corpora.mkdir(parents=True)
    for side in ("forget", "retain"):
        lines = [json.dumps({"text": f"A {side} document number {i} about proteins."}) for i in range(4)]
        (corpora / f"bio-{side}-corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["prepare", "rwku", "--source", str(rwku_source), "--out", str(root / "data/rwku/Batch/1-50")]) == 0
    assert main(["prepare", "tofu", "--authors", "20", "--out", str(root / "data/tofu-20")]) == 0
    (root / "configs").symlink_to(ROOT / "configs")
    (root / "docs").symlink_to(ROOT / "docs")  # a sweep's teacher map (docs/teacher_map/...)
    return root


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_preset_validates_offline(path: Path, workdir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    # the demos and the tiny TOFU fine-tunes write what the other presets read (obliviate-demo/, runs/tofu-*-tiny),
    # and validate refuses to let them overwrite it: they are validated in a fresh folder, as before their first run
    makers = (path.parent == ROOT / "configs" and path.stem.startswith("demo")) or path.stem.startswith("finetune")
    monkeypatch.chdir(tmp_path if makers else workdir)
    if makers:
        (tmp_path / "data").symlink_to(workdir / "data")  # prepared data (`obliviate prepare`) is read, not written
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub access that --offline missed fails instead of connecting
    gpu = "gpu" in path.parts or path.parent.name in ("wmdp", "rwku")  # meant for a GPU machine: its devices not checked here
    args = ["validate", "--offline", *(["--no-device-checks"] if gpu else []), "--config", str(path)]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.startswith("valid (")
    source = str((yaml.safe_load(path.read_text(encoding="utf-8")).get("data") or {}).get("source", ""))
    if source.count("/") == 1 and not (workdir / source).exists():  # a hub data set: named, not fetched
        assert f"skipped: data source {source!r}: a hub id, not fetched (validate --offline)" in out, out
        assert f"data: {source} not loaded" in out


def test_offline_validation_still_catches_what_needs_no_hub(workdir: Path, monkeypatch, capsys) -> None:
    """A hub-backed preset with a bad key, an impossible warm-up or a layer the local model lacks still fails."""
    monkeypatch.chdir(workdir)
    gpu = ROOT / "configs" / "gpu" / "asu_tofu_llama2_7b" / "asu_gd_forget01.yaml"
    assert main(["validate", "--offline", "--config", str(gpu), "train.warmup_ratio=2"]) == 2
    assert "train.warmup_ratio" in capsys.readouterr().err
    assert main(["validate", "--offline", "--config", str(gpu), "method.forget=nope"]) == 2
    assert "nope" in capsys.readouterr().err
    twin = ROOT / "configs" / "twins" / "asu_tofu_llama2_7b" / "asu_gd_forget01.yaml"
    assert main(["validate", "--offline", "--config", str(twin), "method.forget_args.layers=[9]"]) == 2
    assert "layer index 9 is out of range" in capsys.readouterr().err
    assert main(["validate", "--offline", "--config", str(twin)]) == 0
    out = capsys.readouterr().out
    assert "schedule: 6 optimizer steps, 0 of them warming up" in out and "4 layers" in out and "skipped" not in out
    assert main(["validate", "--offline", "--config", str(gpu)]) == 2  # this machine has no bitsandbytes GPU
    assert "train.optimizer=paged_adamw" in capsys.readouterr().err
    assert main(["validate", "--offline", "--no-device-checks", "--config", str(gpu)]) == 0
    out = capsys.readouterr().out
    assert "skipped: train.optimizer=paged_adamw needs bitsandbytes and a CUDA GPU" in out
    assert "model: hub id locuslab/tofu_ft_llama2-7b (skipped: not fetched with --offline" in out
