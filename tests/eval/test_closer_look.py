"""Closer-look FE/MU: hand-computed aggregation, omission labelling, then tiny local embedding/NLI models end to end."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from obliviate.errors import ConfigError
from obliviate.eval.closer_look import (
    CLOSER_LOOK_METRICS,
    FE_KEYS,
    MU_KEYS,
    CloserLookModels,
    cl_truth_ratio,
    clipped_cosine,
    closer_look_ratio,
    closer_look_split,
    embed,
    entailment_id,
    entailment_score,
    evaluate_closer_look,
    forget_efficacy,
    load_closer_look_models,
    model_utility_mu,
    nli_pairs,
    partial_aggregates,
)
from obliviate.eval.tofu import (
    SplitResult,
    evaluate_split,
    forget_truth_ratio,
    retain_truth_ratio,
    truth_ratio,
)

E = math.e


# ---------------------------------------------------------------- pure formulas, by hand
def test_truth_ratio_conversions_by_hand():
    # correct losses 1, 2, 3 against perturbed means 2, 2, 2: TOFU TR = exp(c - p) = e^-1, 1, e
    tr = truth_ratio(np.array([1.0, 2.0, 3.0]), np.array([[2.0, 2.0], [1.0, 3.0], [2.0, 2.0]]))
    r = closer_look_ratio(tr)  # R = exp(p - c) = e, 1, e^-1
    np.testing.assert_allclose(r, [E, 1.0, 1 / E])
    # forget: min(R, 1/R) = e^-1, 1, e^-1 -> 1 - (2/e + 1)/3 = 0.421414
    assert cl_truth_ratio(r, "forget") == pytest.approx(1 - (2 / E + 1) / 3)
    assert cl_truth_ratio(r, "forget") == pytest.approx(0.421414, abs=1e-6)
    assert cl_truth_ratio(r, "forget") == pytest.approx(1 - forget_truth_ratio(tr))
    # others: max(0, 1 - 1/R) = 1 - 1/e, 0, 0 (1 - e < 0) -> 0.632121/3 = 0.210707 = TOFU's retain TR
    assert cl_truth_ratio(r, "retain") == pytest.approx((1 - 1 / E) / 3)
    assert cl_truth_ratio(r, "world_facts") == pytest.approx(retain_truth_ratio(tr))
    # extreme ratios stay finite: R = inf -> forget term 0, other term 1; R = 0 -> 0 and 0
    assert cl_truth_ratio(np.array([np.inf, 0.0]), "forget") == 1.0
    assert cl_truth_ratio(np.array([np.inf, 0.0]), "retain") == 0.5
    with pytest.raises(ValueError, match="non-empty"):
        cl_truth_ratio(np.array([]), "forget")


def _values(**override: float | None) -> dict:
    # six 0.5 on retain, six 1.0 on real authors, six 0.25 on world facts; forget numbers 0.2 .. 0.6
    level = {"retain": 0.5, "real_authors": 1.0, "world_facts": 0.25}
    base = {k: next(v for s, v in level.items() if k.startswith(s)) for k in MU_KEYS}
    base |= dict(zip(FE_KEYS, (0.2, 0.3, 0.4, 0.5, 0.6))) | {"forget_token_entropy": 0.9}
    return base | override


def test_mu_is_the_harmonic_mean_of_eighteen():
    # hmean = 18 / (6/0.5 + 6/1 + 6/0.25) = 18 / (12 + 6 + 24) = 18/42 = 3/7
    mu, used = model_utility_mu(_values())
    assert len(MU_KEYS) == 18 and used == list(MU_KEYS)
    assert mu == pytest.approx(3 / 7)
    # forget numbers never enter MU
    assert model_utility_mu(_values(forget_prob=0.01))[0] == pytest.approx(3 / 7)
    assert model_utility_mu(_values(retain_token_entropy=0.0))[0] == 0.0  # a zero gives 0
    # one left out (a 0.25 on world facts): hmean of 17 = 17 / (42 - 4) = 17/38
    mu, used = model_utility_mu(_values(world_facts_cosine_similarity=None))
    assert mu == pytest.approx(17 / 38) and "world_facts_cosine_similarity" not in used and len(used) == 17
    with pytest.raises(ValueError, match="bad: retain_prob"):
        model_utility_mu(_values(retain_prob=1.5))
    assert model_utility_mu({}) == (None, [])


def test_fe_is_one_minus_the_mean_of_five():
    # 1 - mean(0.2, 0.3, 0.4, 0.5, 0.6) = 1 - 0.4 = 0.6; forget token entropy (0.9) is not among them
    fe, used = forget_efficacy(_values())
    assert fe == pytest.approx(0.6) and used == list(FE_KEYS) and "forget_token_entropy" not in used
    assert forget_efficacy(_values(forget_token_entropy=0.0))[0] == pytest.approx(0.6)
    # without entailment: 1 - mean(0.2, 0.3, 0.4, 0.5) = 0.65
    fe, used = forget_efficacy(_values(forget_entailment_score=None))
    assert fe == pytest.approx(0.65) and len(used) == 4
    assert forget_efficacy({}) == (None, [])


def test_cosine_is_clipped_at_zero():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [3.0, 4.0]])
    b = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 4.0]])
    # -1 -> 0; 1/sqrt 2; orthogonal 0; zero vector 0; identical 1
    np.testing.assert_allclose(clipped_cosine(a, b), [0.0, 1 / math.sqrt(2), 0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="one shape"):
        clipped_cosine(a, b[:2])


def test_low_rouge_counts_as_not_entailed():
    entailed = np.array([True, True, False, True])
    rouge = np.array([0.5, 0.09, 0.9, 0.1])
    # 0.09 < 0.1 -> not entailed despite the label; 0.1 itself is kept -> 2 of 4
    assert entailment_score(entailed, rouge) == 0.5
    assert entailment_score(entailed, np.zeros(4)) == 0.0


def test_nli_order_and_entailment_label():
    gens, golds = ["gen a", "gen b"], ["gold a", "gold b"]
    assert nli_pairs("forget", gens, golds) == (gens, golds)  # premise = generation
    for kind in ("retain", "real_authors", "world_facts"):
        assert nli_pairs(kind, gens, golds) == (golds, gens)  # premise = gold
    assert entailment_id({0: "Entailment", 1: "neutral", 2: "contradiction"}) == 0
    assert entailment_id({0: "not_entailment", 1: "ENTAILMENT"}) == 1
    with pytest.raises(ConfigError, match="entailment label"):
        entailment_id({0: "LABEL_0", 1: "LABEL_1"})


def test_metrics_table():
    assert CLOSER_LOOK_METRICS["fe"].higher_is_better and CLOSER_LOOK_METRICS["mu"].higher_is_better
    assert not CLOSER_LOOK_METRICS["forget_cosine_similarity"].higher_is_better
    assert not CLOSER_LOOK_METRICS["forget_cl_truth_ratio"].higher_is_better
    assert CLOSER_LOOK_METRICS["forget_token_entropy"].higher_is_better
    assert CLOSER_LOOK_METRICS["retain_entailment_score"].higher_is_better
    assert set(MU_KEYS) | set(FE_KEYS) <= set(CLOSER_LOOK_METRICS)
    for name, info in CLOSER_LOOK_METRICS.items():
        assert info.name == name and info.version >= 1 and info.description


# ---------------------------------------------------------------- omission, on hand-made split results
def _fake(kind: str, n: int, perturbed: bool = True) -> SplitResult:
    rouge = np.linspace(0.0, 1.0, n)
    tr = np.exp(np.linspace(-1.0, 1.0, n)) if perturbed else None
    prob = np.full(n, 0.4) if perturbed or kind in ("forget", "retain") else None
    return SplitResult(kind, np.ones(n), prob, tr, rouge, [f"answer number {i} of {kind}" for i in range(n)])


def _rows(world, n: int = 3) -> dict:
    return {"forget": world.splits["forget10_perturbed"][:n], "retain": world.splits["retain_perturbed"][:n],
            "real_authors": world.splits["real_authors_perturbed"][:n],
            "world_facts": world.splits["world_facts_perturbed"][:n]}


def test_partial_aggregates_never_use_the_full_names():
    # complete: FE 0.6 and MU 3/7 (hand values above) under their names, no *_partial
    out, notes = partial_aggregates(_values())
    assert out["fe"] == pytest.approx(0.6) and out["mu"] == pytest.approx(3 / 7) and notes == []
    assert out["fe_partial"] is None and out["mu_partial"] is None and out["fe_complete"] and out["mu_complete"]
    # no embedding and no NLI model: cosine and entailment missing on every split
    gone = {f"{s}_{p}": None for s in ("forget", "retain", "real_authors", "world_facts")
            for p in ("cosine_similarity", "entailment_score")}
    out, notes = partial_aggregates(_values(**gone))
    assert out["fe"] is None and out["mu"] is None and not out["fe_complete"] and not out["mu_complete"]
    # FE over rouge 0.2, prob 0.3, truth ratio 0.4: 1 - 0.3 = 0.7
    assert out["fe_partial"] == pytest.approx(0.7) and len(out["fe_components"]) == 3
    # MU over 4 numbers x 3 splits: 12 / (4/0.5 + 4/1 + 4/0.25) = 12 / 28 = 3/7
    assert out["mu_partial"] == pytest.approx(3 / 7) and len(out["mu_components"]) == 12
    assert notes[0].startswith("mu is null (incomplete): mu_partial is over 12 of 18 numbers; left out: ")
    assert notes[1] == ("fe is null (incomplete): fe_partial is over 3 of 5 numbers; left out: "
                        "forget_cosine_similarity, forget_entailment_score")
    assert CLOSER_LOOK_METRICS["fe_partial"].higher_is_better and "NOT" in CLOSER_LOOK_METRICS["mu_partial"].description


def test_unloadable_models_are_omitted_and_labelled(tmp_path, small_world):
    splits = _rows(small_world)
    results = {k: _fake(k, 3, perturbed=k != "world_facts") for k in splits}
    missing = str(tmp_path / "no_such_model")
    models = load_closer_look_models(embedding=missing, nli=None)
    assert "embedding" in models.failures and models.get("embedding") is None
    # tokenizer None: Token Entropy over whitespace words; "answer number i of <split>" has 5 distinct -> 1.0
    out = evaluate_closer_look(None, None, splits, models=models, tofu_results=results)
    for s in splits:
        assert out[f"{s}_cosine_similarity"] is None and out[f"{s}_entailment_score"] is None
        assert out[f"{s}_rougeL_recall"] == pytest.approx(0.5)  # mean of linspace(0, 1, 3)
        assert out[f"{s}_token_entropy"] == 1.0
    assert any(n.startswith(f"Cosine Similarity omitted: could not load {missing}: ") for n in out["notes"])
    assert "Entailment Score omitted: no nli model configured" in out["notes"]
    assert out["world_facts_prob"] is None and out["world_facts_cl_truth_ratio"] is None
    # TR = e^-1, 1, e -> R = e, 1, e^-1. forget: 1 - (2/e + 1)/3 = 0.421414; others: (1 - 1/e)/3 = 0.210707
    assert out["forget_cl_truth_ratio"] == pytest.approx(0.421414, abs=1e-6)
    assert out["retain_cl_truth_ratio"] == pytest.approx(0.210707, abs=1e-6)
    # MU: retain and ra give rouge 0.5, prob 0.4, TR 0.210707, entropy 1; wf rouge 0.5, entropy 1 = 10 of 18:
    # 10 / (2 (2 + 2.5 + 4.745930 + 1) + 2 + 1) = 10 / 23.491860 = 0.425679
    assert len(out["mu_components"]) == 10 and not out["mu_complete"] and out["mu"] is None
    assert out["mu_partial"] == pytest.approx(0.425679, abs=1e-6)
    # FE: 1 - mean(0.5, 0.4, 0.421414) = 1 - 0.440471 = 0.559529, and never under the name "fe"
    assert out["fe_components"] == ["forget_rougeL_recall", "forget_prob", "forget_cl_truth_ratio"]
    assert out["fe"] is None and out["fe_partial"] == pytest.approx(0.559529, abs=1e-6)
    assert any(n.startswith("mu is null (incomplete): mu_partial is over 10 of 18 numbers; left out: ")
               for n in out["notes"])
    assert out["closer_look_models"] == {"embedding": None, "nli": None}
    # the per-row values a bootstrap resamples: token entropy of every split (1.0 per reply), nothing for the
    # components left out
    assert out["rows"] == {f"{s}_token_entropy": [1.0, 1.0, 1.0] for s in splits}
    with pytest.raises(ValueError, match="the split has 2"):
        evaluate_closer_look(None, None, {"forget": splits["forget"][:2]}, models=models, tofu_results=results)


# ---------------------------------------------------------------- tiny local embedding / NLI models
@pytest.fixture(scope="module")
def local_models(tmp_path_factory, small_world):
    """Random tiny BERT encoder and a 3-way BERT classifier, saved and loaded back by local path."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, BertModel, PreTrainedTokenizerFast

    from obliviate.data.synthetic import corpus_texts

    words = sorted({w for t in corpus_texts(small_world) for w in t.lower().replace(".", " . ").split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]")
    cfg = dict(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=128)
    root = tmp_path_factory.mktemp("closer_look_models")
    torch.manual_seed(0)
    for name, model in (("embed", BertModel(BertConfig(**cfg))),
                        ("nli", BertForSequenceClassification(BertConfig(
                            **cfg, id2label={0: "entailment", 1: "neutral", 2: "contradiction"},
                            label2id={"entailment": 0, "neutral": 1, "contradiction": 2})))):
        if name == "nli":  # always 'entailment', so the score must equal the share with ROUGE >= 0.1
            with torch.no_grad():
                model.classifier.weight.zero_()
                model.classifier.bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
        model.save_pretrained(root / name)
        fast.save_pretrained(root / name)
    return str(root / "embed"), str(root / "nli")


def test_identical_texts_have_cosine_one(local_models):
    models = CloserLookModels(embedding=local_models[0], nli=None)
    text = "She wrote the novel about the sea."
    vecs = embed(models, [text, text, "born in 1961", ""])
    assert vecs is not None and vecs.shape == (4, 32) and not models.failures
    assert clipped_cosine(vecs[:1], vecs[1:2])[0] == pytest.approx(1.0)
    assert 0.0 <= clipped_cosine(vecs[2:3], vecs[3:4])[0] <= 1.0


def test_end_to_end_on_the_trained_model(local_models, trained_small, small_world, small_tok):
    splits = _rows(small_world, n=4)
    models = load_closer_look_models(embedding=local_models[0], nli=local_models[1])
    assert not models.failures
    forget = evaluate_split(trained_small, small_tok, splits["forget"], kind="forget", max_new_tokens=24,
                            batch_size=8, max_length=64)
    out = evaluate_closer_look(trained_small, small_tok, splits, models=models, tofu_results={"forget": forget},
                               max_new_tokens=24, batch_size=8, max_length=64)
    assert out["mu_complete"] and out["fe_complete"] and len(out["mu_components"]) == 18
    for key in (*MU_KEYS, *FE_KEYS, "forget_token_entropy", "mu", "fe"):
        assert 0.0 <= out[key] <= 1.0, key
    assert out["mu_partial"] is None and out["fe_partial"] is None  # complete: only the full names
    assert out["forget_rougeL_recall"] == pytest.approx(float(forget.rougeL_recall.mean()))  # reused, not redone
    assert out["forget_cl_truth_ratio"] == pytest.approx(1 - forget_truth_ratio(forget.truth_ratio))
    assert out["forget_entailment_score"] == pytest.approx(float(np.mean(forget.rougeL_recall >= 0.1)))
    assert out["closer_look_models"] == {"embedding": local_models[0], "nli": local_models[1]}
    assert not any("omitted" in n for n in out["notes"])
    split = closer_look_split(forget, small_tok, models, golds=[r.answer for r in splits["forget"]])
    assert split.per_example["cosine_similarity"].shape == (4,)
    assert split.values["cosine_similarity"] == pytest.approx(out["forget_cosine_similarity"])
    # per-row values of the three numbers that are not TOFU's, for every split; each list's mean is the number
    assert set(out["rows"]) == {f"{s}_{p}" for s in splits
                                for p in ("token_entropy", "cosine_similarity", "entailment_score")}
    for key, values in out["rows"].items():
        assert len(values) == 4 and out[key] == pytest.approx(float(np.mean(values)), abs=1e-12), key


def test_nli_model_without_an_entailment_label_is_an_error(tmp_path, local_models):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    cfg = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)
    BertForSequenceClassification(cfg).save_pretrained(tmp_path / "labels")  # id2label LABEL_0, LABEL_1
    AutoTokenizer.from_pretrained(local_models[1]).save_pretrained(tmp_path / "labels")
    with pytest.raises(ConfigError, match="entailment label"):
        CloserLookModels(embedding=None, nli=str(tmp_path / "labels")).get("nli")
