"""MUSE metrics: hand-computed ROUGE-L F1, prompt format, PrivLeak, loaders, and an end-to-end run."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from obliviate.config import MuseEvalConfig
from obliviate.data.rows import QARow
from obliviate.data.text import chunk_texts, document_ids, load_texts
from obliviate.data.tokenize import collate, pad_id
from obliviate.errors import DataError
from obliviate.eval.memorization import privleak_auc as muse_auc
from obliviate.eval.muse import (
    MUSE_METRICS,
    MuseData,
    VerbMemItem,
    cut_answer,
    evaluate_muse,
    fewshot_prompt,
    fit_prompt,
    greedy_continuations,
    load_muse,
    muse_min_k_auc,
    privleak,
    rouge_l_f1,
)
from obliviate.eval.runner import evaluate_muse_run
from obliviate.modeling.logprobs import forward_stats
from obliviate.modeling.tiny import tiny_llama, train_tokenizer

FORGET = ["Mara Quellen was born in Tessaly in 1962 and wrote the novel Salt Roads about the northern sea.",
          "The harbour of Lindmark froze every winter until the new bridge was opened by the mayor in 1990."]
RETAIN = ["Tom Berg is a poet from Oslo who published his first book of short poems in 1991."]
HOLDOUT = ["The old mill by the river was sold to a baker from Cork after the long dry summer.",
           "A small museum in Vellan keeps letters written by sailors during the great storm."]


def write(path, data, jsonl=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(d) for d in data) + "\n" if jsonl else json.dumps(data))


@pytest.fixture()
def muse_dir(tmp_path):
    """A tiny corpus in the MUSE layout (retain QA under its older hub name retain2_qa)."""
    write(tmp_path / "raw" / "forget.jsonl", [{"text": t} for t in FORGET], jsonl=True)
    write(tmp_path / "verbmem" / "forget.json",
          [{"prompt": t[:40], "gt": t[40:], "rougeL_target": 1.0} for t in FORGET])
    write(tmp_path / "knowmem" / "forget_qa.json",
          [{"question": "Where was Mara Quellen born?", "answer": "Tessaly"},
           {"question": "When was the bridge opened?", "answer": "1990"}])
    write(tmp_path / "knowmem" / "forget_qa_icl.json",
          [{"question": "Who wrote Salt Roads?", "answer": "Mara Quellen"}])
    write(tmp_path / "knowmem" / "retain2_qa.jsonl",
          [{"question": "Where is Tom Berg from?", "answer": "Oslo"}], jsonl=True)
    write(tmp_path / "knowmem" / "retain_qa_icl.json", [{"question": "What is Tom Berg?", "answer": "a poet"}])
    write(tmp_path / "privleak" / "forget.jsonl", [{"text": t} for t in FORGET], jsonl=True)
    write(tmp_path / "privleak" / "holdout.json", [{"text": t} for t in HOLDOUT])
    return tmp_path


def test_rouge_l_f1_by_hand():
    # LCS of "the cat sat on the mat" / "the cat lay on a mat" is "the cat on mat": P = R = 4/6, F1 = 2/3.
    assert rouge_l_f1(["the cat lay on a mat"], ["the cat sat on the mat"]) == pytest.approx([2 / 3])
    # Generation of 2 tokens inside a 4-token target: P = 1, R = 1/2, F1 = 2/3; MUSE does not stem.
    assert rouge_l_f1(["red fox"], ["a red fox runs"]) == pytest.approx([2 / 3])
    assert rouge_l_f1(["cats running"], ["cat run"]) == pytest.approx([0.0])
    assert rouge_l_f1(["cats running"], ["cat run"], use_stemmer=True) == pytest.approx([1.0])
    with pytest.raises(ValueError, match="2 generations but 1 targets"):
        rouge_l_f1(["a", "b"], ["a"])


def test_fewshot_prompt_and_answer_cut():
    shots = [("Who?", "Ann"), ("Where?", "Oslo")]
    assert fewshot_prompt("When?", shots) == ("Question: Who?\nAnswer: Ann\n\n"
                                              "Question: Where?\nAnswer: Oslo\n\n"
                                              "Question: When?\nAnswer: ")
    assert fewshot_prompt("When?", []) == "Question: When?\nAnswer: "
    assert cut_answer("In 1990.\n\nQuestion: next") == "In 1990."
    assert cut_answer("In 1990.\nQuestion: x") == "In 1990."
    assert cut_answer("1990 Question: x") == "1990 "


def test_privleak_and_auc_orientation():
    value, note = privleak(0.25)
    assert value == -50.0 and "0.5" in note
    value, note = privleak(0.6, 0.4)
    assert value == pytest.approx(50.0) and note is None
    for bad in ((1.5, None), (float("nan"), None)):
        with pytest.raises(ValueError):
            privleak(*bad)
    assert privleak(0.5, 0.0)[0] is None  # AUC_retrain 0: undefined, not a number
    # Scores: higher = less likely a member. A model that memorised the forget set scores it lower -> AUC 0.
    assert muse_auc([1.0, 2.0], [3.0, 4.0]) == 0.0
    assert muse_auc([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert muse_auc([1.0, 3.0], [2.0, 2.0]) == 0.5


def test_metric_table_directions():
    assert not MUSE_METRICS["verbmem_forget"].higher_is_better and MUSE_METRICS["knowmem_retain"].higher_is_better
    assert not MUSE_METRICS["privleak_abs"].higher_is_better and "privleak_abs" in MUSE_METRICS["privleak"].description


def test_fit_prompt_keeps_bos_and_end():
    assert fit_prompt([1, 10, 11, 12, 13], 3, 1) == [1, 12, 13]
    assert fit_prompt([1, 10], 3, 1) == [1, 10]


def word_tokenizer(adds_bos: bool):
    """One token per word w0..w299 (words joined by spaces when decoded); a BOS added to every encoding or none,
    though both name one (like Llama's tokenizer and GPT-2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": 4 + i for i in range(300)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def words(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def test_verbmem_gold_counts_the_bos_among_its_128_tokens(monkeypatch):
    from obliviate.eval import muse

    llama_like, gpt2_like = word_tokenizer(True), word_tokenizer(False)
    assert llama_like(words(3))["input_ids"] == [1, 4, 5, 6] and gpt2_like(words(3))["input_ids"] == [4, 5, 6]
    gt = words(200)
    # MUSE: tokenizer(gt).input_ids[:, :128], decoded without special tokens -> BOS + 127 words, or 128 words
    assert muse.truncate_tokens(llama_like, gt, 128) == words(127)
    assert muse.truncate_tokens(gpt2_like, gt, 128) == words(128)
    assert muse.truncate_tokens(llama_like, words(127), 128) == words(127)  # BOS + 127 fit: kept whole
    # verbmem_scores scores against that gold: a continuation repeating all 200 words has LCS 127 with it,
    # so F1 = 2·127 / (200 + 127) (against 128 words it would be 2·128 / (200 + 128))
    monkeypatch.setattr(muse, "greedy_continuations", lambda *a, **k: ([gt], 0))
    for tok, kept in ((llama_like, 127), (gpt2_like, 128)):
        scores, _, _ = muse.verbmem_scores(None, tok, [VerbMemItem("prompt", gt)])
        assert scores.tolist() == [pytest.approx(2 * kept / (200 + kept), abs=1e-12)]


def test_load_muse_layout(muse_dir):
    data = load_muse(muse_dir)
    assert data.verbmem_forget[0] == VerbMemItem(FORGET[0][:40], FORGET[0][40:])
    assert [r.answer for r in data.knowmem_forget] == ["Tessaly", "1990"]
    assert data.knowmem_retain == (QARow("Where is Tom Berg from?", "Oslo"),)  # found under retain2_qa
    assert data.privleak_holdout == tuple(HOLDOUT) and data.missing() == ["privleak_retain"]
    small = data.head(1)
    assert len(small.knowmem_forget) == 1 and len(small.privleak_holdout) == 1
    assert small.knowmem_forget_icl == data.knowmem_forget_icl  # few-shot examples are kept whole
    assert load_texts(muse_dir, "raw/forget") == FORGET  # the training corpus of the same layout


def test_load_muse_errors(muse_dir, tmp_path_factory):
    write(muse_dir / "verbmem" / "forget.json", [{"prompt": "p", "gt": "g"}, {"prompt": "p"}])
    with pytest.raises(DataError, match=r"forget\.json item 1: field 'gt' must be a non-empty string"):
        load_muse(muse_dir)
    (muse_dir / "verbmem" / "forget.json").unlink()
    write(muse_dir / "knowmem" / "forget_qa.json", [{"question": "q?"}])
    with pytest.raises(DataError, match=r"forget_qa\.json item 0: missing field 'answer'"):
        load_muse(muse_dir)
    (muse_dir / "knowmem" / "forget_qa.json").unlink()
    (muse_dir / "privleak" / "forget.jsonl").write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    with pytest.raises(DataError, match=r"privleak/forget\.jsonl:2: missing field 'text'"):
        load_muse(muse_dir)
    with pytest.raises(DataError, match="no MUSE data found"):
        load_muse(tmp_path_factory.mktemp("empty"))


def test_load_muse_from_mocked_hub(monkeypatch):
    import datasets
    splits = {"verbmem": {"forget": [{"prompt": "p", "gt": "g", "rougeL_target": 1.0}]},
              "knowmem": {"forget_qa": [{"question": "q?", "answer": "a"}],
                          "retain_qa": [{"question": "r?", "answer": "b"}]},
              "privleak": {"forget": [{"text": "f"}], "holdout": [{"text": "h"}], "retain": [{"text": "r"}]}}
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config: splits[config])
    data = load_muse("muse-bench/MUSE-News")
    assert data.verbmem_forget == (VerbMemItem("p", "g"),) and data.privleak_retain == ("r",)
    assert data.missing() == ["knowmem_forget_icl", "knowmem_retain_icl"]


def min_k_auc(model, tok, forget, holdout, k=0.4):
    """Min-K% (k = 0.4) by hand: -mean of the lowest 40% token log-probs of each text, then MUSE's AUC."""
    def scores(texts):
        enc = chunk_texts(tok, texts, max_length=128, min_tokens=2)
        with torch.no_grad():
            st = forward_stats(model, collate(enc, pad_id(tok)), keep_logits=False)
        out = []
        for lp, m in zip(st.token_logp, st.mask):
            vals = torch.sort(lp[m]).values
            out.append(-vals[: max(1, int(len(vals) * k))].mean().item())
        return out
    return muse_auc(scores(forget), scores(holdout))


@pytest.fixture(scope="module")
def tok_model():
    """A 1-layer hidden-32 Llama trained 60 full-batch Adam steps on the forget + retain text (about 1 s)."""
    tok = train_tokenizer(FORGET + RETAIN + HOLDOUT + ["Question: Answer:"], vocab_size=400)
    model = tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=4, max_position_embeddings=128)
    batch = collate(chunk_texts(tok, FORGET + RETAIN, max_length=64), pad_id(tok))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = forward_stats(model, batch, keep_logits=False).nll.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return tok, model.eval()


def test_batched_continuation_equals_one_at_a_time(tok_model):
    tok, model = tok_model
    prompts = [FORGET[0][:40], "The", FORGET[1][:60] + " and then", HOLDOUT[0][:20], "x"]
    batched, cut = greedy_continuations(model, tok, prompts, max_new_tokens=12, batch_size=3)
    single = [greedy_continuations(model, tok, [p], max_new_tokens=12, batch_size=1)[0][0] for p in prompts]
    assert batched == single and cut == 0
    # A memorised passage is continued verbatim.
    assert FORGET[0][40:].strip().startswith(batched[0][:20]) and len(batched[0]) >= 20
    _, cut = greedy_continuations(model, tok, [FORGET[0] * 3], max_new_tokens=100)  # > 128 - 100 prompt tokens
    assert cut == 1


def test_evaluate_muse_end_to_end(tok_model, muse_dir):
    tok, model = tok_model
    data = load_muse(muse_dir)
    res = evaluate_muse(model, tok, data, mia_auc_fn=min_k_auc, batch_size=2, verbmem_max_new_tokens=32)
    assert set(MUSE_METRICS) <= set(res)
    for name in ("verbmem_forget", "knowmem_forget", "knowmem_retain"):
        assert 0.0 <= res[name] <= 1.0
        assert len(res["per_example"][name]["generations"]) == len(res["per_example"][name]["rougeL_f1"])
    assert res["verbmem_forget"] > 0.5  # the model was trained on these passages
    assert 0.0 <= res["privleak_auc"] <= 1.0 and res["privleak_auc"] < 0.5  # forget looks like training data
    assert res["privleak"] == pytest.approx((res["privleak_auc"] - 0.5) / 0.5 * 100)
    assert res["privleak_abs"] == abs(res["privleak"]) and math.isfinite(res["privleak"])
    assert any("AUC_retrain = 0.5" in n for n in res["notes"])

    bare = evaluate_muse(model, tok, MuseData(knowmem_retain=data.knowmem_retain), batch_size=2)
    assert set(bare) == {"knowmem_retain", "notes", "per_example"}
    notes = " | ".join(bare["notes"])
    assert "privleak not computed" in notes and "verbmem_forget not computed" in notes and "zero-shot" in notes
    with_ref = evaluate_muse(model, tok, MuseData(privleak_forget=tuple(FORGET), privleak_holdout=tuple(HOLDOUT)),
                             mia_auc_fn=lambda m, t, f, h: 0.3, retrain_auc=0.6)
    assert with_ref["privleak"] == pytest.approx(-50.0) and with_ref["privleak_auc_retrain"] == 0.6
    assert not any("defaults" in n for n in with_ref["notes"])


def test_document_ids_shared_with_training(tok_model):
    tok, _ = tok_model
    ids = document_ids(tok, FORGET[0])
    assert ids[0] == tok.bos_token_id and np.all(np.array(ids[1:]) != tok.bos_token_id)


# ---------------------------------------------------------------- PrivLeak over whole documents, as MUSE runs it
def test_privleak_scores_whole_documents_by_hand(tok_model, tmp_path, constant_lm):
    tok, _ = tok_model
    the = tok(" the", add_special_tokens=False)["input_ids"]
    mill = tok("mill mill", add_special_tokens=False)["input_ids"]
    assert len(the) == 1 and len(mill) == 4 and the[0] not in mill  # "mill" = 2 tokens, " mill" = 2 tokens
    # forget: 110 x "mill" (220 tokens) then 400 x " the" (400 tokens); holdout: 310 x "mill" (620 tokens).
    forget = " ".join(["mill"] * 110) + " the" * 400
    holdout = " ".join(["mill"] * 310)
    write(tmp_path / "privleak" / "forget.jsonl", [{"text": forget}, {"text": "  "}], jsonl=True)
    write(tmp_path / "privleak" / "holdout.json", [{"text": holdout}])
    model = constant_lm(len(tok), the[0])  # log p(" the") = 10 - log Z, any other token -log Z
    # Min-40% of the whole forget document: lowest int(0.4 x 620) = 248 = 220 mill + 28 the -> score
    # log Z - 280/248 < log Z = the holdout's score -> P(forget > holdout) = 0 -> PrivLeak (0 - 0.5)/0.5 = -100
    res = evaluate_muse_run(model, tok, MuseEvalConfig(source=str(tmp_path)))
    assert res["privleak_auc"] == 0.0 and res["privleak"] == -100.0
    assert "privleak: Min-40% over whole documents, each in one pass" in res["notes"]
    assert any(n.startswith("1 empty document(s) skipped while loading: ") and "forget.jsonl:2" in n
               for n in res["notes"])
    # The old cut (first 256 tokens: BOS + 220 mill + 35 the): lowest int(0.4 x 255) = 102 are all mill -> log Z,
    # a tie with the holdout -> AUC 0.5 -> PrivLeak 0: the forget set would look unlearned.
    cut = evaluate_muse_run(model, tok, MuseEvalConfig(source=str(tmp_path), privleak_max_tokens=256))
    assert cut["privleak_auc"] == 0.5 and cut["privleak"] == 0.0
    # Windows of 64 tokens, stride 32: each token once (this model ignores context) -> the same AUC 0
    win = evaluate_muse_run(model, tok, MuseEvalConfig(source=str(tmp_path), privleak_window=64, privleak_stride=32))
    assert win["privleak_auc"] == 0.0
    assert ("privleak: Min-40% over whole documents; 2 of 2 documents longer than the 64-token window, scored in "
            "windows of 64 with stride 32") in win["notes"]


def test_muse_min_k_auc_defaults_to_the_model_context(tok_model):
    tok, model = tok_model  # max_position_embeddings 128
    notes: list[str] = []
    long_doc = " ".join(FORGET * 4)  # > 128 tokens
    auc = muse_min_k_auc(model, tok, [long_doc, FORGET[0]], HOLDOUT, notes=notes)
    assert 0.0 <= auc <= 1.0
    assert notes == ["privleak: Min-40% over whole documents; 1 of 4 documents longer than the 128-token window, "
                     "scored in windows of 128 with stride 64"]


def test_raw_corpus_empty_documents_and_explicit_files(tmp_path, capsys):
    from obliviate.data.splits import load_data as _load_data

    raw = tmp_path / "raw"
    write(raw / "forget.json", [{"text": "first"}, {"text": ""}, "third", " \n"])  # MUSE-News has one empty
    (raw / "forget.txt").write_text("the whole book", encoding="utf-8")
    with pytest.raises(DataError, match=r"forget\.json item 1: the document is empty"):
        load_texts(tmp_path, "raw/forget")  # strict unless the caller collects what was skipped
    skipped: list[str] = []
    assert load_texts(tmp_path, "raw/forget", skipped=skipped) == ["first", "third"]
    assert [w.rsplit(" ", 2)[-2:] for w in skipped] == [["item", "1"], ["item", "3"]]
    # the split written with its extension picks that file, though raw/forget.json exists
    assert load_texts(tmp_path, "raw/forget.txt") == ["the whole book"]
    assert load_texts(tmp_path, "raw/forget.json", skipped=[]) == ["first", "third"]
    # training data: the empty documents are left out and counted
    assert _load_data(str(tmp_path), "text", ["raw/forget"]) == ["first", "third"]
    assert "skipped 2 empty document(s): " in capsys.readouterr().out
    write(raw / "blank.jsonl", [{"text": ""}], jsonl=True)
    with pytest.raises(DataError, match=r"the corpus is empty.*\(1 empty document\(s\) skipped\)"):
        load_texts(tmp_path, "raw/blank", skipped=[])

