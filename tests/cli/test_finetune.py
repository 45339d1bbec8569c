"""`obliviate finetune` with knows.split: what the model knows of a split after every epoch, kept in the history
(so a resumed run keeps it) and summarised in metrics.json as the first epoch at the bar."""
from __future__ import annotations

import json
import math

import pytest
import torch

from obliviate.cli import main
from obliviate.data.rows import load_split
from obliviate.data.synthetic import make_world, write_world
from obliviate.eval.known import knows, recall_check
from obliviate.modeling.load import load_model, load_tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return write_world(make_world(5, seed=3, forget_percents=(20,)), tmp_path_factory.mktemp("w") / "world")


def _args(world, out, *extra):
    return ["finetune", "model.path=tiny", f"data.source={world}", "data.splits=[full]", "tiny.hidden_size=32",
            "tiny.vocab_size=400", "train.epochs=3", "train.batch_size=8", "train.lr=3e-3", "train.progress=false",
            "data.max_length=48", "knows.split=forget20", "knows.max_new_tokens=12", f"output_dir={out}", *extra]


def test_the_check_runs_after_every_epoch_and_its_last_value_is_the_saved_models(world, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(_args(world, out)) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    n = len(load_split(world, "full"))
    epoch = math.ceil(n / 8)
    steps = len(metrics["history"])
    assert steps == math.ceil(3 * n / 8)
    checked = [h["step"] for h in metrics["history"] if "eval_rougeL_recall" in h]
    assert checked == sorted({s for s in range(epoch, steps + 1, epoch)} | {steps})
    k = metrics["knows"]
    assert (k["split"], k["bar"]) == ("forget20", 0.8) and [c["step"] for c in k["curve"]] == checked
    assert [c["epoch"] for c in k["curve"]] == [round(s * 8 / n, 4) for s in checked]  # passes over the rows
    first = next((c for c in k["curve"] if knows(c, 0.8)), None)
    assert k["first_step"] == (first["step"] if first else None)
    # the last check ran on the weights that were saved: the saved model, loaded again, answers the same
    model, tok = load_model(str(out)), load_tokenizer(str(out))
    again = recall_check(model, tok, load_split(world, "forget20"), max_new_tokens=12)
    assert again["rougeL_recall"] == pytest.approx(k["last_rougeL_recall"], abs=1e-9)
    assert again["fact_recall"] == pytest.approx(k["last_fact_recall"], abs=1e-9) and again["fact_recall"] is not None
    assert "forget20: recall" in capsys.readouterr().out


def test_a_resumed_run_keeps_the_checks_made_before_it_stopped(world, tmp_path, monkeypatch):
    from obliviate.train import loop

    whole = tmp_path / "whole"
    assert main(_args(world, whole)) == 0
    ck = tmp_path / "ck"
    cut = _args(world, tmp_path / "cut", f"train.checkpoint_dir={ck}", "train.checkpoint_every=1")
    original, count = loop._finish_step, [0]

    def stop_after_epoch_one(*a, **k):
        count[0] += 1
        if count[0] > math.ceil(len(load_split(world, "full")) / 8) + 1:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(loop, "_finish_step", stop_after_epoch_one)
    assert main(cut) != 0 and not (tmp_path / "cut").exists()
    recorded = torch.load(ck / "checkpoint.pt", weights_only=False)["fingerprint"]
    monkeypatch.setattr(loop, "_finish_step", original)
    assert main(cut) == 0
    # the fingerprint kept beside the model is the one its checkpoint recorded before the first step
    assert json.loads((tmp_path / "cut" / "fingerprint.json").read_text()) == recorded
    resumed = json.loads((tmp_path / "cut" / "metrics.json").read_text())["knows"]
    assert resumed == json.loads((whole / "metrics.json").read_text())["knows"]
    assert resumed["curve"][0]["step"] < count[0]  # the first check was made before the stop


@pytest.mark.parametrize("extra, names", [
    (["knows.split=forget99"], "forget99"),
    (["data.format=text", "data.source={docs}"], "data.format"),
    (["knows.bar=1.5"], "knows.bar"),
    (["train.fsdp=true"], "train.fsdp"),
])
def test_a_check_that_cannot_run_is_refused_before_training(world, tmp_path, capsys, extra, names):
    out, docs = tmp_path / "t", tmp_path / "docs.jsonl"
    docs.write_text('{"text": "a raw document"}\n', encoding="utf-8")
    assert main(_args(world, out, *[e.format(docs=docs) for e in extra])) == 2
    assert names in capsys.readouterr().err and not out.exists()


def test_the_same_fine_tune_again_reuses_the_saved_model_and_another_is_refused(world, tmp_path, capsys, monkeypatch):
    from obliviate.train import loop

    out = tmp_path / "t"
    assert main(_args(world, out)) == 0
    saved = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    steps = []
    monkeypatch.setattr(loop, "_finish_step", lambda *a, **k: steps.append(1))
    assert main(_args(world, out, "train.progress=true")) == 0  # progress does not enter the fingerprint
    printed = capsys.readouterr().out
    assert "already holds this fine-tune" in printed and "forget20: recall" in printed
    assert steps == [] and (out / "model.safetensors").read_bytes() == saved
    for change, named in (("train.lr=1e-3", "train.lr"), ("data.splits=[retain80]", "data.rows_sha256"),
                          ("tiny.seed=1", "model.weights_sha256")):
        assert main(_args(world, out, change)) == 2
        err = capsys.readouterr().err
        assert "holds another fine-tune" in err and named in err and "overwrite=true" in err
        assert steps == [] and (out / "model.safetensors").read_bytes() == saved


def test_overwrite_trains_again_and_an_output_without_a_fingerprint_is_still_refused(world, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(_args(world, out, "knows.split=null")) == 0
    assert main(_args(world, out)) == 0  # the same run, now asking for the check: reused, and told why no check
    assert "trained without a knows check" in capsys.readouterr().out
    assert main(_args(world, out, "knows.split=null", "train.lr=1e-3", "overwrite=true")) == 0
    assert json.loads((out / "fingerprint.json").read_text())["train.lr"] == 1e-3
    assert "reusing" not in capsys.readouterr().out
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert main(_args(world, other)) == 2
    assert "already exists" in capsys.readouterr().err and (other / "notes.txt").read_text() == "mine"


def test_the_check_leaves_the_training_as_it_was(world, tmp_path):
    """Same weights, bit for bit, with and without the check: it draws no random numbers and changes no state."""
    with_check, without = tmp_path / "a", tmp_path / "b"
    assert main(_args(world, with_check, "knows.every_steps=1")) == 0
    assert main(_args(world, without, "knows.split=null")) == 0
    assert (with_check / "model.safetensors").read_bytes() == (without / "model.safetensors").read_bytes()
    assert json.loads((with_check / "fingerprint.json").read_text()) == json.loads((without / "fingerprint.json").read_text())
