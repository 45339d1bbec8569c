"""The model card beside an unlearned model: Hub metadata that huggingface_hub's own parser reads back (base model,
datasets, tags, licence, model-index results, the receipt's digests), above the hand-written body."""
from __future__ import annotations

import json

from huggingface_hub import ModelCard, metadata_load
from huggingface_hub.repocard_data import model_index_to_eval_results

from obliviate.receipt.card import base_facts, dataset_id, model_card

AFTER = {"forget_quality": 0.25, "model_utility": 0.5, "forget_truth_ratio": 0.625, "retain_rougeL_recall": 0.875,
         "forget_prob": None, "mia_loss_auc": float("nan"), "n_rows": 40, "is_fluent": True,
         "forget_generations": ["a"], "notes": ["a note"]}


def receipt(*overrides: str, start: str = "my-org/base-7b") -> dict:
    """A receipt as `build_receipt` writes it, for a run of NPO+NLL+SAGO (config from RunConfig itself)."""
    from obliviate.config import RunConfig, load_config, to_dict

    cfg = load_config(RunConfig, None, ["method.forget=npo", "method.retain=nll", "method.combine.rule=sago",
                                        f"model.path={start}", "data.source=tofu", "output_dir=runs/npo-forget10",
                                        *overrides])
    side = {"split": "forget10", "n_rows": 400, "n_encoded": 400, "sha256": "f" * 64, "rows": []}
    return {
        "receipt_version": 1, "created": "2025-01-01T00:00:00Z", "obliviate_version": "0.1.0", "config": to_dict(cfg),
        "seeds": {"train.seed": 0}, "method": {"label": cfg.method.label, "forget": "npo", "retain": "nll",
                                               "rule": "sago", "resolved": {}},
        "data": {"source": cfg.data.source, "format": cfg.data.format,
                 "tokenization": {"max_length": 256, "chat_template": False, "vocab_size": 100, "vocab_sha256": "v" * 64},
                 "forget": side, "retain": {**side, "split": "retain90", "n_rows": 3600, "sha256": "r" * 64}},
        "weights": {"start": {"source": start, "dtype": "bfloat16", "sha256": "0" * 64, "n_tensors": 3},
                    "final": {"sha256": "1" * 64, "n_tensors": 3}, "changed": ["a"]},
        "metrics": {"steps": 5}, "audit": None,
    }


def parsed(card: str) -> tuple[dict, dict]:
    """(metadata as ModelCard reads it, metric name -> EvalResult as metadata_load + model_index_to_eval_results
    read the model-index)."""
    meta = ModelCard(card).data.to_dict()
    return meta, {r.metric_type: r for r in parsed_results(card)}


def parsed_results(card: str) -> list:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "README.md").write_text(card, encoding="utf-8")
        index = metadata_load(Path(d) / "README.md")["model-index"]
    name, results = model_index_to_eval_results(index)
    assert name == "npo-forget10"  # the run's output directory
    return results


def test_the_card_metadata_round_trips_through_huggingface_hub():
    r = receipt()
    card = model_card(r, ["Who wrote X?"], AFTER)
    meta, results = parsed(card)
    assert meta["base_model"] == "my-org/base-7b" and meta["datasets"] == ["locuslab/TOFU"]
    assert meta["tags"] == ["unlearning", "obliviate", "npo+nll+sago", "npo"]
    assert "license" not in meta  # a hub id that is not in the (offline) cache: its licence is unknown
    assert meta["pipeline_tag"] == "text-generation" and meta["library_name"] == "transformers"
    assert meta["obliviate"] == {"obliviate_version": "0.1.0", "receipt": "receipt.json", "receipt_version": 1,
                                 "method": "npo+nll+sago", "final_weights_sha256": "1" * 64,
                                 "start_weights_sha256": "0" * 64, "forget_rows_sha256": "f" * 64,
                                 "retain_rows_sha256": "r" * 64}
    # every registered, finite metric, each with its own value; null, NaN, counts, flags and lists left out
    assert {k: v.metric_value for k, v in results.items()} == {
        "forget_quality": 0.25, "model_utility": 0.5, "forget_truth_ratio": 0.625, "retain_rougeL_recall": 0.875}
    for res in results.values():
        assert (res.task_type, res.dataset_type, res.dataset_name) == ("text-generation", "locuslab/TOFU", "TOFU")
    assert results["forget_quality"].dataset_config == "forget10_perturbed"  # the split each metric is measured on
    assert results["retain_rougeL_recall"].dataset_config == "retain_perturbed"
    assert results["model_utility"].dataset_config is None  # several splits
    body = card.split("\n---\n", 1)[1]  # the hand-written body is kept below the metadata
    for part in ("## What was unlearned", "## How", "## How it was measured", "## Provenance", "Who wrote X?",
                 "| forget_quality | 0.250 | ↑ |", "obliviate verify receipt.json <dir>", "1" * 64, "## Card metadata"):
        assert part in body, part
    assert "base model `my-org/base-7b`: the starting model (model.path, a hub id)" in body
    assert "licence unknown" in body


def test_each_result_names_the_split_it_was_measured_on():
    """forget_* -> eval.forget_split, retain_* -> eval.retain_split, real_authors_* and world_facts_* -> their own."""
    after = {"forget_truth_ratio": 0.5, "retain_truth_ratio": 0.25, "real_authors_truth_ratio": 0.625,
             "world_facts_truth_ratio": 0.75}
    _, results = parsed(model_card(receipt("eval.real_authors_split=ra_split", "eval.world_facts_split=wf_split"),
                                   [], after))
    assert {k: r.dataset_config for k, r in results.items()} == {
        "forget_truth_ratio": "forget10_perturbed", "retain_truth_ratio": "retain_perturbed",
        "real_authors_truth_ratio": "ra_split", "world_facts_truth_ratio": "wf_split"}
    assert {k: r.metric_value for k, r in results.items()} == after


def test_max_examples_is_recorded_with_the_results_and_no_evaluation_means_no_model_index():
    _, results = parsed(model_card(receipt("eval.max_examples=4"), [], {"forget_quality": 0.1}))
    assert results["forget_quality"].dataset_args == {"max_examples": 4}
    meta = ModelCard(model_card(receipt(), [], None)).data.to_dict()
    assert "model-index" not in meta and meta["datasets"] == ["locuslab/TOFU"]


def test_a_local_start_directory_gives_what_its_own_card_declares(tmp_path):
    start = tmp_path / "finetuned"
    start.mkdir()
    (start / "README.md").write_text("---\nbase_model: meta-llama/Llama-3.2-1B\nlicense: llama3.2\n---\n# mine\n")
    meta = ModelCard(model_card(receipt(start=str(start)), [], None)).data.to_dict()
    assert (meta["base_model"], meta["license"]) == ("meta-llama/Llama-3.2-1B", "llama3.2")

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "llama", "license": "apache-2.0"}))
    card = model_card(receipt(start=str(bare)), [], None)
    meta = ModelCard(card).data.to_dict()
    assert "base_model" not in meta and meta["license"] == "apache-2.0"  # the licence of its config.json
    assert "whose card names no base model, so this card declares none" in card
    (bare / "README.md").write_text("# a card without front matter\n")
    assert base_facts(str(bare)).base_model is None


def test_datasets_are_hub_ids_only(tofu_dir, tmp_path):
    assert dataset_id("tofu") == dataset_id(str(tofu_dir)) == "locuslab/TOFU"  # the shipped copy, by name or path
    assert dataset_id("org/data") == "org/data" and dataset_id(str(tmp_path)) is None and dataset_id(None) is None
    local = receipt(f"data.source={tmp_path}")
    meta, results = parsed(model_card(local, [], {"forget_quality": 0.5}))
    assert "datasets" not in meta
    assert (results["forget_quality"].dataset_type, results["forget_quality"].dataset_name) == (
        tmp_path.name, f"{tmp_path.name} (local data)")
    both = ModelCard(model_card(receipt("eval.source=org/tofu-eval"), [], None)).data.to_dict()
    assert both["datasets"] == ["locuslab/TOFU", "org/tofu-eval"]  # training data, then the evaluation's


def test_muse_runs_name_the_muse_data_and_lora_adapters_say_peft():
    r = receipt("data.format=text", "data.source=muse-bench/MUSE-News", "muse.source=muse-bench/MUSE-News",
                "model.lora.enabled=true", "model.lora.merge_on_save=false")
    meta, results = parsed(model_card(r, [], {"verbmem_forget": 0.3, "privleak": -5.0}))
    assert meta["datasets"] == ["muse-bench/MUSE-News"] and meta["library_name"] == "peft"
    assert {k: (v.dataset_type, v.metric_value) for k, v in results.items()} == {
        "verbmem_forget": ("muse-bench/MUSE-News", 0.3), "privleak": ("muse-bench/MUSE-News", -5.0)}


def test_a_gguf_file_declares_no_base_model():
    facts = base_facts("model.gguf")
    assert facts.base_model is None and facts.license is None and "GGUF" in facts.note


def test_the_shipped_alias_declares_the_model_its_file_quantises():
    facts = base_facts("smollm2-135m-instruct")
    assert (facts.base_model, facts.license) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in facts.note


def _audit_line(card: str) -> str:
    return next(x for x in card.splitlines() if x.startswith("- audit: "))


def test_the_card_says_what_became_of_the_audit():
    """Not run; run after the card (audit.enabled: the verdict goes into receipt.json later); or each attack's share."""
    assert _audit_line(model_card(receipt(), [], AFTER)) == "- audit: not run"
    assert "run after this card was written" in _audit_line(model_card(receipt("audit.enabled=true"), [], AFTER))
    audited = {**receipt(), "audit": {"verdict": {"relearn": {"share": 0.125}, "mia": {"share": None}}}}
    assert _audit_line(model_card(audited, [], AFTER)) == (
        "- audit: share of the forgotten knowledge each attack brought back: relearn 0.12, mia n/a (receipt.json "
        "`audit`)")
