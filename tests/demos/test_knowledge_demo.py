"""The real-model demo pipeline end to end on a tiny model (a local directory) and a facts file made from
what that model answers, so every group is non-empty; plus its config errors."""
from __future__ import annotations

import json

import pytest

from obliviate.config import load_config
from obliviate.demos.knowledge import run_knowledge_demo
from obliviate.errors import ObliviateError
from obliviate.setups.knowledge import KnowledgeDemoConfig


def _cfg(model_dir, facts_file, out, **over):
    raw = {"kind": "knowledge", "model": {"path": str(model_dir)},
           "knowledge": {"facts": str(facts_file), "forget_families": ["fam_a"], "max_new_tokens": 8, "batch_size": 8,
                         "max_eval": 4},
           "max_length": 64, "unlearn": {"max_steps": 2, "batch_size": 2, "lr": 1e-3, "progress": False},
           "methods": {"ASU_auto": {"forget": "asu", "forget_args": {"tau": "auto"}, "retain": "kl"},
                       "GradDiff": {"forget": "ga", "retain": "nll"}},
           "calibrate": {"taus": [2.0, 4.0], "layer_sets": [[0], None], "functional_budget": 5.0, "min_factual": 0.0},
           "output_dir": str(out)}
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return load_config_from(raw)


def load_config_from(raw):
    from obliviate.config import build

    return build(KnowledgeDemoConfig, raw)


def test_knowledge_demo_end_to_end(model_dir, facts_file, tmp_path):
    out = tmp_path / "demo"
    res = run_knowledge_demo(_cfg(model_dir, facts_file, out), log=lambda s: None)
    assert set(res["runs"]) == {"original", "ASU_auto", "GradDiff"}
    orig = res["runs"]["original"]["metrics"]
    assert orig["forget_accuracy"] == 1.0  # known facts, same greedy decoding: the original scores 1 by construction
    auto = res["runs"]["ASU_auto"]["method"]["forget_args"]
    assert auto["tau"] in (2.0, 4.0) and auto["layers"] in ([0], None)
    assert (auto["tau"], auto["layers"]) == (res["calibration"]["recommended"]["tau"], res["calibration"]["recommended"]["layers"])
    assert len(res["runs"]["GradDiff"]["history"]) == 2 and "teacher_token_shift" in res["runs"]["ASU_auto"]["analysis"]
    for f in ("results.json", "report.md", "report.html", "facts/forget.jsonl", "facts/retain.jsonl"):
        assert (out / f).is_file(), f
    md = (out / "report.md").read_text()
    assert "forget acc ↓" in md and "What the model knows (probe)" in md and "| fam_a |" in md
    forget = [json.loads(x) for x in (out / "facts" / "forget.jsonl").read_text().splitlines()]
    assert len(forget) == len(res["groups"]["forget"]) and all(x["fact_spans"] for x in forget)


def test_unknown_family_fails_before_loading_and_writes_nothing(facts_file, tmp_path):
    out = tmp_path / "demo"
    cfg = _cfg(tmp_path / "no-model-here", facts_file, out, knowledge={"forget_families": ["capital"]})
    with pytest.raises(ObliviateError, match=r"unknown families \['capital'\]; valid: \['fam_a', 'fam_b'\]"):
        run_knowledge_demo(cfg, log=lambda s: None)
    assert not out.exists()


def test_config_checks(model_dir, facts_file, tmp_path):
    from obliviate.errors import ConfigError

    with pytest.raises(ConfigError, match="retain_share"):
        _cfg(model_dir, facts_file, tmp_path, knowledge={"retain_share": 0.0})
    with pytest.raises(ConfigError, match="methods.X.forget_args.tau='hot' is impossible"):
        _cfg(model_dir, facts_file, tmp_path, methods={"X": {"forget": "asu", "forget_args": {"tau": "hot"}}})
    bad = _cfg(tmp_path / "no-model", facts_file, tmp_path / "o", methods={"X": {"forget": "asu", "forget_args": {"temp": 2}}})
    with pytest.raises(ConfigError, match=r"unknown hyper-parameter\(s\) \['temp'\]"):
        run_knowledge_demo(bad, log=lambda s: None)
    cfg = load_config(KnowledgeDemoConfig, "configs/demo_real.yaml")
    assert cfg.needs_calibration() and cfg.model.path == "smollm2-135m-instruct"


def test_knowledge_demo_audits_each_method_when_asked(model_dir, facts_file, tmp_path):
    res = run_knowledge_demo(_cfg(model_dir, facts_file, tmp_path / "demo", audit=True), log=lambda s: None)
    audit = res["runs"]["GradDiff"]["audit"]
    assert {row["attack"] for row in audit["rows"]} == {"relearn", "quantize", "paraphrase", "mia"}
    assert audit["baseline"]["original"]["k"] > 0  # θ0 knows the forget facts: the 100% reference exists
    assert "recovered" in audit["table"] and "audit" in res["runs"]["ASU_auto"] and "audit" not in res["runs"]["original"]
