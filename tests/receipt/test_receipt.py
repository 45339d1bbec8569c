"""receipt.json beside an unlearned model, the model card, and `obliviate verify` (Python and CLI)."""
from __future__ import annotations

import hashlib
import json
import shutil
import struct

import pytest
import torch

from obliviate.cli import main
from obliviate.receipt import (
    attach_audit,
    dir_hashes,
    model_hashes,
    row_digest,
    safetensors_hashes,
    torch_tensor_hash,
    verify,
    weights_digest,
)

RUN = ["--config", "configs/tofu/graddiff.yaml", "data.forget_split=forget01", "data.retain_split=retain99",
       "data.max_length=128", "train.max_steps=1", "train.grad_accum=1", "train.progress=false", "eval.enabled=false"]


@pytest.fixture(scope="module")
def start_dir(small_tok, tmp_path_factory):
    """θ0: an untrained tiny Llama (tied embeddings) with the shared small tokenizer, saved as a model directory."""
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama

    out = tmp_path_factory.mktemp("start") / "model"
    save_model(out, tiny_llama(small_tok, hidden_size=32, num_layers=1, num_heads=4, seed=0), small_tok)
    return out


def _unlearn(start, tofu, out, *extra):
    """One step of GradDiff on the real TOFU forget01 / retain99 files, no evaluation."""
    assert main(["unlearn", *RUN, f"model.path={start}", f"data.source={tofu}", f"output_dir={out}", *extra]) == 0
    return out


@pytest.fixture(scope="module")
def run_dir(start_dir, tofu_dir, tmp_path_factory):
    return _unlearn(start_dir, tofu_dir, tmp_path_factory.mktemp("runs") / "unlearned", "train.lr=1e-3")


@pytest.fixture
def copy(run_dir, tmp_path):
    """A copy of the run's output to tamper with."""
    return shutil.copytree(run_dir, tmp_path / "copy")


def test_tensor_hash_is_the_documented_canonical_form(tmp_path):
    t = torch.tensor([[1.0, 2.0, 3.0]])
    by_hand = hashlib.sha256(b"float32|1,3\n" + struct.pack("<3f", 1.0, 2.0, 3.0)).hexdigest()
    assert torch_tensor_hash(t) == {"sha256": by_hand, "dtype": "float32", "shape": [1, 3]}
    lines = f"a:{by_hand}\nb:{'0' * 64}\n".encode()
    assert weights_digest({"b": {"sha256": "0" * 64}, "a": {"sha256": by_hand}}) == hashlib.sha256(lines).hexdigest()
    assert row_digest([5, 6], [-100, 6]) == hashlib.sha256(b'{"input_ids":[5,6],"labels":[-100,6]}').hexdigest()
    from safetensors.torch import save_file

    tensors = {"a": t, "half": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).T, "scalar": torch.tensor(7)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "x.safetensors")
    from_file = safetensors_hashes(tmp_path / "x.safetensors")  # raw bytes of the file, no torch
    assert from_file == {k: torch_tensor_hash(v) for k, v in tensors.items()}
    assert from_file["scalar"]["sha256"] == hashlib.sha256(b"int64|\n" + struct.pack("<q", 7)).hexdigest()


def test_theta0_hashes_list_tied_weights_once_like_the_saved_file(start_dir):
    from obliviate.modeling.load import load_pretrained

    model, _ = load_pretrained(str(start_dir))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied in memory
    found = {k: {x: v[x] for x in ("sha256", "dtype", "shape")} for k, v in dir_hashes(start_dir).items()}
    assert model_hashes(model) == found and "lm_head.weight" not in found


def test_receipt_records_data_weights_config_and_versions(run_dir, start_dir):
    r = json.loads((run_dir / "receipt.json").read_text())
    assert r["receipt_version"] == 1 and r["audit"] is None and r["created"].endswith("Z")
    assert r["config"]["data"]["forget_split"] == "forget01" and r["seeds"] == {"train.seed": 0, "audit.seed": 0}
    assert r["packages"]["torch"] == torch.__version__ and r["packages"]["python"]
    f, ret, tok = r["data"]["forget"], r["data"]["retain"], r["data"]["tokenization"]
    assert (f["n_rows"], len(f["rows"]), ret["n_rows"]) == (40, 40, 3960)
    assert f["sha256"] == hashlib.sha256("\n".join(f["rows"]).encode()).hexdigest()
    assert tok["max_length"] == 128 and tok["chat_template"] is False and len(tok["vocab_sha256"]) == 64
    start, final = r["weights"]["start"], r["weights"]["final"]
    assert start["sha256"] == weights_digest(dir_hashes(start_dir))  # θ0 = the starting model's file, hashed before training
    assert final["sha256"] == weights_digest(dir_hashes(run_dir)) != start["sha256"]  # lr 1e-3 moved the weights
    assert r["weights"]["changed"] and set(final["tensors"]) == set(start["tensors"])
    assert r["metrics"]["after"] is None and r["metrics"]["steps"] == 1
    card = (run_dir / "README.md").read_text()
    assert "forget01" in card and "40 rows" in card and "Basil Mahfouz Al-Kuwaiti" in card and "ga+nll" in card
    assert "obliviate verify receipt.json <dir>" in card and final["sha256"] in card


def test_a_step_too_small_to_move_float32_weights_keeps_the_theta0_digest(start_dir, tofu_dir, tmp_path):
    """lr must be > 0: at 1e-46 every Adam update is below float32's smallest subnormal (1.4e-45), so not even a
    zero weight (the pad row of the embedding, which 1e-30 does move) can change: final == θ0, digest for digest."""
    r = json.loads((_unlearn(start_dir, tofu_dir, tmp_path / "still", "train.lr=1e-46") / "receipt.json").read_text())
    assert r["weights"]["final"]["sha256"] == r["weights"]["start"]["sha256"] and r["weights"]["changed"] == []


@pytest.mark.parametrize("merge", [True, False])
def test_lora_receipts_hash_what_is_saved(start_dir, tofu_dir, tmp_path, merge):
    """merge_on_save: the merged weights, named as θ0, only adapted matrices changed; off: the adapter file."""
    out = _unlearn(start_dir, tofu_dir, tmp_path / "lora", "train.lr=1e-2", "model.lora.enabled=true",
                   f"model.lora.merge_on_save={str(merge).lower()}")
    w = json.loads((out / "receipt.json").read_text())["weights"]
    assert verify(out / "receipt.json", out).ok and (out / "model.safetensors").is_file() == merge
    if merge:
        assert set(w["final"]["tensors"]) == set(w["start"]["tensors"]) and w["changed"]
        assert all(n.endswith("proj.weight") for n in w["changed"])  # norms and embeddings untouched
    else:
        assert w["changed"] is None and all("lora_" in n for n in w["final"]["tensors"])
        assert "LoRA adapters only" in (out / "README.md").read_text()  # our card, not peft's


def test_verify_passes_on_an_untouched_output(run_dir, tofu_dir, capsys):
    assert verify(run_dir / "receipt.json", run_dir).ok
    assert main(["verify", str(run_dir / "receipt.json"), str(run_dir), "--data", str(tofu_dir)]) == 0
    assert "OK: weights, files and data rows match" in capsys.readouterr().out


def _tensor_offset(path, name):
    """Byte offset of tensor `name`'s data in a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return 8 + n + json.loads(raw[8:8 + n])[name]["data_offsets"][0]


def test_one_flipped_weight_byte_is_named(copy, capsys):
    name = "model.layers.0.mlp.up_proj.weight"
    weights = copy / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[_tensor_offset(weights, name) + 5] ^= 0x01
    weights.write_bytes(bytes(raw))
    res = verify(copy / "receipt.json", copy)
    assert not res.ok and not res.overall_match and [d.name for d in res.differences] == [name]
    assert main(["verify", str(copy / "receipt.json"), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS: 1 difference" in out and name in out and "overall weights digest: DIFFERS" in out


def test_a_changed_config_file_and_a_missing_tensor_are_named(copy, capsys):
    from safetensors.torch import load_file, save_file

    tensors = load_file(copy / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert main(["verify", str(copy / "receipt.json"), str(copy)]) == 1
    out = capsys.readouterr().out
    assert "model.norm.weight" in out and "missing" in out and "config.json" in out and "content differs" in out


def test_an_edited_forget_row_is_named_with_its_question(run_dir, tofu_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(tofu_dir / "retain99.jsonl", data)
    rows = [json.loads(line) for line in (tofu_dir / "forget01.jsonl").read_text().splitlines()]
    rows[7]["answer"] += " An edit past max_length=128 tokens."  # cut off: training never saw it, so no difference
    (data / "forget01.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert verify(run_dir / "receipt.json", run_dir, str(data)).ok
    rows[7]["question"] = "Edited: " + rows[7]["question"]
    (data / "forget01.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = verify(run_dir / "receipt.json", run_dir, str(data))
    assert [(d.kind, d.name) for d in res.differences] == [("data", "forget")] and res.overall_match
    assert main(["verify", str(run_dir / "receipt.json"), str(run_dir), "--data", str(data)]) == 1
    out = capsys.readouterr().out
    assert "row 7 differs" in out and rows[7]["question"][:40] in out and "1 of 40 rows differ" in out


def test_bad_receipt_or_model_dir_exits_2_with_one_line(copy, tmp_path, capsys):
    receipt = copy / "receipt.json"
    text = receipt.read_text()
    for body, message in (("{not json", "is not valid JSON"), ("[]", "is not an obliviate receipt"),
                          ('{"receipt_version": 1}', "is incomplete")):
        receipt.write_text(body)
        assert main(["verify", str(receipt), str(copy)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("obliviate: error:") and message in err and err.count("\n") == 1, err
    receipt.write_text(text)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["verify", str(receipt), str(empty)]) == 2
    assert "not a model directory" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "none.json"), str(copy)]) == 2


def test_attach_audit_rewrites_the_receipt_atomically(copy):
    before = json.loads((copy / "receipt.json").read_text())
    attach_audit(copy / "receipt.json", {"relearn": {"recovered": 0.12}})
    after = json.loads((copy / "receipt.json").read_text())
    assert after["audit"] == {"relearn": {"recovered": 0.12}} and {**after, "audit": None} == before
    assert not [p for p in copy.iterdir() if p.name.startswith(".")]  # no temporary file left
    assert verify(copy / "receipt.json", copy).ok  # the receipt's own digest is not part of what it checks


def test_model_card_has_the_after_metrics_table(run_dir):
    from obliviate.receipt.card import model_card

    receipt = json.loads((run_dir / "receipt.json").read_text())
    card = model_card(receipt, ["Who is X?"], {"forget_quality": 0.25, "model_utility": 0.5, "notes": ["n"]})
    assert "| forget_quality | 0.250 | ↑ |" in card and "| model_utility | 0.500 |" in card and "Who is X?" in card
