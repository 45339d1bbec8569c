"""eval.retain_reference: forget quality from a retain model's evaluation log in open-unlearning's layout
(TOFU_EVAL.json, entry forget_truth_ratio.value_by_index) equals forget quality from the retain model itself; a log
that is not that layout is refused before anything loads, naming the file, what was expected and what was found."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from obliviate.cli import main
from obliviate.config import EvalConfig
from obliviate.data.synthetic import write_world
from obliviate.errors import ConfigError, DataError
from obliviate.eval.retain_reference import load_retain_reference

FORGET = "forget10_perturbed"


def open_unlearning_log(truth_ratios, **extra) -> dict:
    """A TOFU_EVAL.json as open-unlearning writes it (src/evals/metrics/memorization.py `truth_ratio`, aggregator
    closer_to_1_better; src/evals/base.py `save_logs`): per-row scores keyed by the row index as a string."""
    tr = np.asarray(truth_ratios, dtype=np.float64)
    return {"forget_Q_A_Prob": {"agg_value": 0.5, "value_by_index": {"0": {"prob": 0.5, "avg_loss": 0.7}}},
            "forget_truth_ratio": {"agg_value": float(np.mean(np.minimum(tr, 1 / (tr + 1e-10)))),
                                   "value_by_index": {str(i): {"score": float(s)} for i, s in enumerate(tr)}},
            **extra}


@pytest.fixture(scope="module")
def world_dir(small_world, tmp_path_factory):
    return write_world(small_world, tmp_path_factory.mktemp("w") / "world")


@pytest.fixture(scope="module")
def eval_cfg(world_dir, model_dir):
    return EvalConfig(source=str(world_dir), forget_split=FORGET, retain_split=None, real_authors_split=None,
                      world_facts_split=None, retain_model=str(model_dir), max_new_tokens=2, memorization=False)


def test_reference_log_gives_the_same_forget_quality_as_the_retain_model(eval_cfg, model_dir, small_tok, small_world,
                                                                          tmp_path):
    from obliviate.eval.runner import evaluate_tofu_run as evaluate
    from obliviate.eval.runner import forget_truth_ratios
    from obliviate.modeling.load import load_pretrained
    from obliviate.modeling.tiny import tiny_llama

    unlearned = tiny_llama(small_tok, hidden_size=48, num_layers=2, num_heads=4, seed=7).eval()  # not the retain model
    with_model = evaluate(unlearned, small_tok, "", eval_cfg, 64)["eval"]
    retain, rtok = load_pretrained(str(model_dir))
    retain_tr = forget_truth_ratios(retain, rtok, small_world.splits[FORGET], eval_cfg, 64)
    log = tmp_path / "TOFU_EVAL.json"
    log.write_text(json.dumps(open_unlearning_log(retain_tr), indent=4))
    ref_cfg = dataclasses.replace(eval_cfg, retain_model=None, retain_reference=str(log))
    with_log = evaluate(unlearned, small_tok, "", ref_cfg, 64)["eval"]
    fq = with_model["forget_quality"]
    assert fq is not None and 0 < fq < 1  # two different models: a p-value strictly inside (0, 1)
    assert with_log["forget_quality"] == fq  # the same number, not merely close
    assert with_log["forget_truth_ratio"] == with_model["forget_truth_ratio"]
    assert any(str(log) in n for n in with_log["notes"])
    # the log's rows are read in index order whatever the order of its keys (KS needs no order; the array keeps it)
    shuffled = open_unlearning_log(retain_tr)
    shuffled["forget_truth_ratio"]["value_by_index"] = dict(reversed(shuffled["forget_truth_ratio"]["value_by_index"]
                                                                     .items()))
    log.write_text(json.dumps(shuffled))
    np.testing.assert_array_equal(load_retain_reference(log, len(retain_tr)), retain_tr)


def test_privleak_takes_its_reference_auc_from_the_log_as_open_unlearning_does(eval_cfg, model_dir, small_tok, small_world,
                                                                              world_dir, tmp_path):
    """open-unlearning's privleak (src/evals/metrics/privacy.py) reads the retain log's mia_min_k AUC and uses
    1 - AUC: the same number as the retain model's own Min-K% AUC here, so privleak is the same number; without
    mia_min_k in the log the default 0.5 applies, with its note."""
    from obliviate.eval.runner import evaluate_tofu_run as evaluate
    from obliviate.eval.runner import forget_truth_ratios
    from obliviate.modeling.load import load_pretrained
    from obliviate.modeling.tiny import tiny_llama

    cfg = dataclasses.replace(eval_cfg, memorization=True, holdout_split="holdout10")
    unlearned = tiny_llama(small_tok, hidden_size=48, num_layers=2, num_heads=4, seed=7).eval()
    with_model = evaluate(unlearned, small_tok, str(world_dir), cfg, 64)["eval"]
    retain, rtok = load_pretrained(str(model_dir))
    retain_tr = forget_truth_ratios(retain, rtok, small_world.splits[FORGET], cfg, 64)
    auc = with_model["privleak_auc_retrain"]
    assert auc is not None and auc != 0.5
    log = tmp_path / "TOFU_EVAL.json"
    log.write_text(json.dumps(open_unlearning_log(retain_tr, mia_min_k={"agg_value": 1 - auc})))
    with_log = evaluate(unlearned, small_tok, str(world_dir), dataclasses.replace(cfg, retain_model=None,
                                                                     retain_reference=str(log)), 64)["eval"]
    assert with_log["privleak_auc_retrain"] == pytest.approx(auc, abs=1e-15)
    assert with_log["privleak"] == pytest.approx(with_model["privleak"], abs=1e-9)
    log.write_text(json.dumps(open_unlearning_log(retain_tr)))
    without = evaluate(unlearned, small_tok, str(world_dir), dataclasses.replace(cfg, retain_model=None,
                                                                    retain_reference=str(log)), 64)["eval"]
    assert without["privleak_auc_retrain"] is None and any("AUC_retrain = 0.5" in n for n in without["notes"])
    assert without["privleak"] == pytest.approx((without["privleak_auc"] - 0.5) / 0.5 * 100, abs=1e-9)


GOOD = open_unlearning_log([0.5, 1.5, 0.25])
BAD_FORMATS = [
    ("not-json", "{'forget_truth_ratio': oops", "not JSON"),
    ("top-level-list", [GOOD], "the top level is a list, not an object of metric entries"),
    ("no-forget-truth-ratio", {"forget_Q_A_Prob": GOOD["forget_Q_A_Prob"]},
     "no 'forget_truth_ratio' entry (entries found: forget_Q_A_Prob)"),
    ("entry-a-number", {"forget_truth_ratio": 0.7}, "forget_truth_ratio is a number"),
    ("no-value-by-index", {"forget_truth_ratio": {"agg_value": 0.7}}, "forget_truth_ratio.value_by_index is missing"),
    ("value-by-index-a-list", {"forget_truth_ratio": {"value_by_index": [0.5, 1.5, 0.25]}},
     "forget_truth_ratio.value_by_index is a list"),
    ("item-without-score", {"forget_truth_ratio": {"value_by_index": {"0": {"prob": 0.5}, "1": {"score": 1.0},
                                                                      "2": {"score": 1.0}}}},
     "value_by_index['0'] holds score None"),
    ("score-null", {"forget_truth_ratio": {"value_by_index": {"0": {"score": 1.0}, "1": {"score": None},
                                                              "2": {"score": 1.0}}}},
     "value_by_index['1'] holds score None"),
    ("score-negative", {"forget_truth_ratio": {"value_by_index": {"0": {"score": -2.0}, "1": {"score": 1.0},
                                                                  "2": {"score": 1.0}}}},
     "value_by_index['0'] holds score -2.0; expected {\"score\": <truth ratio>}, a finite number > 0"),
    ("item-a-number", {"forget_truth_ratio": {"value_by_index": {"0": 0.5, "1": 1.5, "2": 0.25}}},
     "value_by_index['0'] holds a number"),
    ("key-not-an-index", {"forget_truth_ratio": {"value_by_index": {"a": {"score": 0.5}, "1": {"score": 1.5},
                                                                    "2": {"score": 0.25}}}},
     "has the key 'a'; expected row indices"),
    ("too-few-rows", open_unlearning_log([0.5, 1.5]),
     "forget_truth_ratio holds 2 per-row truth ratios, but the forget split evaluated here has 3 rows"),
    ("too-many-rows", open_unlearning_log([0.5, 1.5, 0.25, 0.9]),
     "forget_truth_ratio holds 4 per-row truth ratios, but the forget split evaluated here has 3 rows"),
]


@pytest.mark.parametrize("content, message", [c[1:] for c in BAD_FORMATS], ids=[c[0] for c in BAD_FORMATS])
def test_each_bad_format_names_the_file_the_expectation_and_the_finding(tmp_path, content, message):
    path = tmp_path / "TOFU_EVAL.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DataError) as err:
        load_retain_reference(path, 3)
    assert str(err.value).startswith(f"eval.retain_reference {str(path)!r}: ") and message in str(err.value), err.value
    assert "expected" in str(err.value)


def test_missing_file_and_a_directory(tmp_path):
    with pytest.raises(DataError, match="no such file; expected open-unlearning's evaluation log"):
        load_retain_reference(tmp_path / "nope.json", 3)
    with pytest.raises(DataError, match="is a directory"):
        load_retain_reference(tmp_path, 3)
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(GOOD))
    np.testing.assert_array_equal(load_retain_reference(path, 3), [0.5, 1.5, 0.25])


def test_retain_model_and_retain_reference_together_is_a_config_error():
    with pytest.raises(ConfigError, match="eval.retain_reference='r.json' is impossible: it must be null when "
                                          "eval.retain_model is set"):
        EvalConfig(retain_model="m", retain_reference="r.json")


def _fails(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("obliviate: error:") and message in err, err


def test_commands_refuse_a_bad_reference_before_loading_and_write_nothing(world_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    bad = tmp_path / "TOFU_EVAL.json"
    bad.write_text(json.dumps(open_unlearning_log([1.0] * 4)))  # the forget split has 15 rows
    ev = ["eval", f"model.path={model_dir}", f"eval.source={world_dir}", f"eval.forget_split={FORGET}",
          f"output_dir={out}"]
    _fails(capsys, ev + [f"eval.retain_reference={bad}"], "holds 4 per-row truth ratios, but the forget split "
                                                          "evaluated here has 15 rows")
    _fails(capsys, ev + [f"eval.retain_reference={bad}", "eval.max_examples=3"], "has 3 rows")
    _fails(capsys, ev + [f"eval.retain_reference={tmp_path / 'none.json'}"], "no such file")
    _fails(capsys, ev + [f"eval.retain_reference={bad}", "eval.forget_split=forget10"],
           "forget split cannot give truth ratios")
    _fails(capsys, ev + [f"eval.retain_reference={bad}", f"eval.retain_model={model_dir}"],
           "must be null when eval.retain_model is set")
    un = ["unlearn", f"model.path={model_dir}", f"data.source={world_dir}", "data.forget_split=forget10",
          "data.retain_split=retain90", "train.progress=false", f"eval.forget_split={FORGET}", f"output_dir={out}"]
    _fails(capsys, un + [f"eval.retain_reference={bad}"], "holds 4 per-row truth ratios")
    _fails(capsys, un + [f"eval.retain_reference={bad}", "eval.forget_split=null"],
           "eval.retain_reference is set but eval.forget_split is null")
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    un_v, ev_v = ["--as", "unlearn", *un[1:-1]], ["--as", "eval", *ev[1:-1]]  # no command name, no output_dir
    _fails(capsys, ["validate", *un_v, f"eval.retain_reference={bad}"], "holds 4 per-row truth ratios")
    _fails(capsys, ["validate", *ev_v, f"eval.retain_reference={bad}"], "holds 4 per-row truth ratios")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(open_unlearning_log([1.0] * 15)))
    for args in (un_v, ev_v):
        assert main(["validate", *args, f"eval.retain_reference={good}"]) == 0
        assert f"eval retain reference: {good} (15 forget truth ratios)" in capsys.readouterr().out


def test_a_sweep_takes_forget_quality_from_the_reference(model_dir, small_world, eval_cfg, tmp_path):
    import optuna
    import yaml

    from obliviate.config import build
    from obliviate.eval.runner import forget_truth_ratios
    from obliviate.modeling.load import load_pretrained
    from obliviate.sweep.config import SweepConfig
    from obliviate.sweep.run import run_sweep

    world = write_world(small_world, tmp_path / "world")
    retain, rtok = load_pretrained(str(model_dir))  # θ0 is the retain model here: its forget quality must be 1
    log = tmp_path / "TOFU_EVAL.json"
    log.write_text(json.dumps(open_unlearning_log(forget_truth_ratios(retain, rtok, small_world.splits[FORGET][:2],
                                                                      eval_cfg, 64))))
    base = tmp_path / "run.yaml"
    base.write_text(yaml.safe_dump({
        "model": {"path": str(model_dir)}, "data": {"source": str(world), "forget_split": "forget10",
                                                   "retain_split": "retain90", "max_length": 64},
        "method": {"forget": "npo", "retain": "nll"}, "train": {"max_steps": 1, "batch_size": 2, "progress": False},
        "eval": {"forget_split": FORGET, "retain_reference": str(log), "max_examples": 2, "max_new_tokens": 2,
                 "holdout_split": None}, "output_dir": "ignored"}))
    out = tmp_path / "sw"
    cfg = build(SweepConfig, {"base": str(base), "space": {"train.lr": {"float": [1e-4, 1e-2], "log": True}},
                              "trials": 1, "sampler": "random", "output_dir": str(out)})
    assert run_sweep(cfg, log=lambda s: None)["outcomes"] == {"complete": 1}
    study = optuna.load_study(study_name="sweep/npo+nll", storage=f"sqlite:///{out.resolve() / 'sweep.db'}")
    assert study.user_attrs["original"]["forget_quality"] == pytest.approx(1.0)
    assert study.get_trials()[0].user_attrs["metrics"]["forget_quality"] is not None


def test_a_rewritten_log_is_read_again(tmp_path):
    """The parsed log is kept per version of the file (pre-flight and evaluation read it once): a rewrite is seen."""
    import json

    log = tmp_path / "TOFU_EVAL.json"
    for scores in ([0.5, 0.25], [0.75, 0.125, 2.0]):
        log.write_text(json.dumps({"forget_truth_ratio": {"value_by_index": {str(i): {"score": s} for i, s in
                                                                             enumerate(scores)}}}))
        assert load_retain_reference(log, len(scores)).tolist() == scores
    # a rewrite of the same size (another score with as many digits) is a new version too: its time differs
    import os

    before = log.stat()
    log.write_text(log.read_text().replace("0.125", "0.375"))
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert log.stat().st_size == before.st_size
    assert load_retain_reference(log, 3).tolist() == [0.75, 0.375, 2.0]
