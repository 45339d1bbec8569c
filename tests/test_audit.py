"""obliviate audit: verdict arithmetic, RTN quantisation, probes, and relearning on tiny models built here."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from obliviate.audit.verdict import (
    AttackRow,
    mark_headlines,
    recovered_share,
    share_interval,
    share_text,
    share_with_interval,
)
from obliviate.config.audit import AuditConfig
from obliviate.errors import ConfigError

ML = 48  # max tokens of the tiny cases


# ---------------------------------------------------------------- verdict arithmetic
def test_recovered_share_hand_computed():
    # K_original 0.9 (100%), K_ref0 0.1 (0%): K 0.5 is half-way back; 0.1 is nothing; 0.9 everything.
    assert recovered_share(0.5, 0.9, 0.1) == pytest.approx(0.5)
    assert recovered_share(0.1, 0.9, 0.1) == pytest.approx(0.0)
    assert recovered_share(0.9, 0.9, 0.1) == pytest.approx(1.0)
    # a reference swap or a sign error would not give these: below the 0% reference is negative, raw
    assert recovered_share(0.0, 0.9, 0.1) == pytest.approx(-0.125)
    assert recovered_share(0.3, 0.6, 0.2) == pytest.approx(0.25)
    # undefined: a value missing, or the original knows no more than the reference
    assert recovered_share(None, 0.9, 0.1) is None
    assert recovered_share(0.5, 0.1, 0.1) is None
    assert recovered_share(0.5, 0.1, 0.3) is None


def test_share_text_clips_and_marks():
    assert share_text(0.5) == "50%"
    assert share_text(-0.125) == "0%*"
    assert share_text(1.4) == "100%*"
    assert share_text(None) == "n/a"


def test_share_interval_draws_the_three_models_on_the_same_rows():
    # every row recovers exactly half of what the original knew over the reference: any paired draw gives 50%
    # (drawing the attacked model's rows apart from the original's would not)
    original, ref0 = [1.0, 0.2, 1.0, 0.2], [0.0, 0.0, 0.0, 0.0]
    assert share_interval([0.5, 0.1, 0.5, 0.1], original, ref0) == pytest.approx((0.5, 0.5))
    # half the rows fully back, half not at all: the share is the drawn mean of [1, 0, 1, 0]; 4 rows drawn, so
    # P(no row back) = P(all back) = 1/16 > 2.5%: the 95% interval spans [0, 1]
    assert share_interval([1.0, 0.0, 1.0, 0.0], [1.0] * 4, ref0) == pytest.approx((0.0, 1.0))
    # at level 0.5 the quartiles of {0, 1/4, ..., 1} drawn with weights 1, 4, 6, 4, 1 (of 16): 1/4 and 3/4
    assert share_interval([1.0, 0.0, 1.0, 0.0], [1.0] * 4, ref0, level=0.5) == pytest.approx((0.25, 0.75))
    # a row whose K is undefined (NaN: no asked fact) is left out of all three
    nan = float("nan")
    assert share_interval([0.5, 0.1, 0.5, 0.1, nan], original + [1.0], ref0 + [0.0]) == pytest.approx((0.5, 0.5))
    assert share_interval([0.5, 0.1, 0.5, 0.1], original, [nan, nan, nan, 0.0]) is None  # one row left
    assert share_interval([0.5, 0.5], [0.3, 0.3], [0.3, 0.3]) is None  # the original knew no more: undefined
    with pytest.raises(ValueError, match="same rows"):
        share_interval([0.5, 0.1], [1.0, 0.2, 1.0], [0.0, 0.0])


def test_share_with_interval_clips_the_ends():
    assert share_with_interval(0.5, (0.3, 1.2)) == "50% [30%, 100%]"
    assert share_with_interval(-0.1, [-0.4, 0.2]) == "0%* [0%, 20%]"
    assert share_with_interval(0.5, None) == "50%" and share_with_interval(None, (0.1, 0.2)) == "n/a"


def test_attack_row_share_and_headlines():
    rows = [AttackRow("relearn", "forget 4/14 rows", "fact_recall", 10, 0.0, 0.4, 0.8, 0.0, "r", 0.0,
                      interval=(0.25, 0.75)),
            AttackRow("relearn", "retain-only control", "fact_recall", 10, 0.0, 0.8, 0.8, 0.0, "r", 0.0),
            AttackRow("quantize", "int8", "fact_recall", 14, 0.2, 0.3, 0.6, 0.2, "r", 0.1),
            AttackRow("quantize", "int4", "fact_recall", 14, 0.2, 0.5, 0.6, 0.2, "r", 0.1)]
    assert rows[0].share == pytest.approx(0.5)
    assert rows[2].share == pytest.approx(0.25)
    assert rows[2].share_without_attack == pytest.approx(0.2)  # (0.2 - 0.1) / (0.6 - 0.1)
    verdict = mark_headlines(rows)
    assert verdict["relearn"]["variant"] == "forget 4/14 rows"  # the control is never the headline
    assert verdict["quantize"]["variant"] == "int4" and verdict["quantize"]["share"] == pytest.approx(0.75)
    assert verdict["relearn"]["interval"] == [0.25, 0.75] and verdict["quantize"]["interval"] is None
    assert [r.headline for r in rows] == [True, False, False, True]
    assert rows[0].to_json()["share"] == pytest.approx(0.5)


def test_audit_config_checks_and_split_names():
    assert AuditConfig().split_names() == ("forget10", "retain90", "holdout10")
    assert AuditConfig(forget_split="forget05_perturbed").split_names() == ("forget05", "retain95", "holdout05")
    assert AuditConfig(forget_split="mine", retain_split="r").split_names() == ("mine", "r", None)
    with pytest.raises(ConfigError, match="audit.attacks"):
        AuditConfig(attacks=["relearn", "bribe"])
    with pytest.raises(ConfigError, match="audit.relearn_share"):
        AuditConfig(relearn_share=1.0)


# ---------------------------------------------------------------- quantisation
def test_rtn_int8_per_row_grid_and_error():
    from obliviate.audit.quantize import rtn_int8

    w = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 16)[:, None]
    q = rtn_int8(w)
    scale = w.abs().amax(1, keepdim=True) / 127
    assert q.shape == w.shape and q.dtype == w.dtype
    assert all(len(torch.unique(row)) <= 256 for row in q)
    assert ((w - q).abs() <= scale / 2 + 1e-6).all()
    steps = q / scale
    assert torch.allclose(steps, steps.round(), atol=1e-3)  # every value on the row's grid
    assert not torch.equal(q, w)


def test_rtn_int4_group_grid_and_error():
    from obliviate.audit.quantize import rtn_int4

    w = torch.randn(8, 300, generator=torch.Generator().manual_seed(1))
    q = rtn_int4(w, group_size=128)  # groups: columns 0-127, 128-255, 256-299 (a short last group)
    for lo, hi in ((0, 128), (128, 256), (256, 300)):
        g, gq = w[:, lo:hi], q[:, lo:hi]
        scale = (g.amax(1, keepdim=True) - g.amin(1, keepdim=True)) / 15
        assert all(len(torch.unique(row)) <= 16 for row in gq)
        assert ((g - gq).abs() <= scale / 2 + 1e-6).all()
    assert (w - q).abs().max() > 1e-3  # 16 levels do move the weights


def test_quantized_copy_changes_linear_weights_only(case):
    from obliviate.audit.quantize import quantizable_linears, quantized_copy

    model = case["original"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q8 = quantized_copy(model, "rtn_int8")
    names = {n for n, _ in quantizable_linears(model)}
    assert names and not any("lm_head" in n for n in names)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model itself is untouched
    qs = q8.state_dict()
    for k, v in before.items():
        linear = k.removesuffix(".weight") in names and k.endswith(".weight")
        assert torch.equal(qs[k], v) != linear, k  # Linear weights changed, embeddings / norms / head kept
        if linear:
            assert max(len(torch.unique(row)) for row in qs[k]) <= 256


# ---------------------------------------------------------------- probes
def test_probes_prompts_and_scores(case):
    from obliviate.audit.probes import (
        answer_prefix,
        completion_probe,
        direct_probe,
        few_shot_shots,
        few_shot_text,
        item_scores,
        k_metric,
        paraphrase_probe,
    )

    tok, forget, retain = case["tok"], case["forget"], case["retain"]
    born = next(r for r in forget if r.question.startswith("Where was"))
    assert answer_prefix(born) == born.answer[:born.answer.index(" was born in")] + " was born in"
    assert k_metric(forget) == "fact_recall"
    comp = completion_probe(tok, [born])
    assert comp.given[0].endswith("was born in")
    assert tok.decode(comp.prompts[0]).endswith("Answer: " + answer_prefix(born))
    # facts the prompt states do not count; the asked ones do
    direct = direct_probe(tok, [born])
    assert item_scores([born.answer], [born], direct, "fact_recall")[0] == 1.0
    assert item_scores(["no idea"], [born], direct, "fact_recall")[0] == 0.0
    assert paraphrase_probe(tok, [born]).given[0] == born.paraphrased_question
    plain = [r.__class__(question=r.question, answer=r.answer) for r in forget]
    assert paraphrase_probe(tok, plain) is None
    shots = few_shot_shots(retain, 2, seed=0)
    text = few_shot_text(tok, born.question, shots)
    assert text.count("Question:") == 3 and shots[0].answer in text and text.endswith(born.question + "\nAnswer:")


# ---------------------------------------------------------------- relearning on tiny models
@pytest.fixture(scope="module")
def case():
    """A 4-author world (forget25 = 1 author, 14 QA): an original trained on all, a model never trained on the
    forget author, and the original after 6 gradient-ascent steps (facts gone, knowledge suppressed)."""
    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.data.synthetic import corpus_texts, make_world
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer
    from obliviate.train.unlearn import finetune, unlearn

    world = make_world(4, seed=1, forget_percents=(25,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    retain = world.splits["retain75"]

    def trained(rows):
        m = tiny_llama(tok, hidden_size=64, num_layers=2, num_heads=4, seed=0)
        finetune(m, tok, rows, TrainConfig(max_steps=200, batch_size=16, lr=5e-3, progress=False, weight_decay=0.0),
                 max_length=ML)
        return m.eval()

    original, never = trained(world.splits["full"]), trained(retain)
    unlearned = copy.deepcopy(original)
    for p in unlearned.parameters():
        p.requires_grad_(True)
    unlearn(unlearned, tok, world.splits["forget25"], retain, MethodConfig(forget="ga", retain=None),
            TrainConfig(max_steps=6, batch_size=8, lr=1e-3, scheduler="constant", weight_decay=0.0, progress=False),
            max_length=ML)
    return {"world": world, "tok": tok, "forget": world.splits["forget25_perturbed"], "retain": retain,
            "holdout": world.splits["holdout25"], "original": original, "never": never,
            "unlearned": unlearned.eval()}


RELEARN = AuditConfig(attacks=["relearn"], relearn_share=0.3, relearn_lr=1e-3, relearn_steps=10,
                      max_new_tokens=24, max_length=ML)


def _relearn(case, model):
    from obliviate.audit import run_audit

    res = run_audit(model, case["original"], case["tok"], case["forget"], retain_rows=case["retain"], cfg=RELEARN,
                    log=lambda s: None)
    attack, control = res.rows
    assert control.variant == "retain-only control" and attack.n == control.n == 10  # 4 of 14 rows trained on
    return res, attack, control


def test_relearning_recovers_suppressed_knowledge(case):
    res, attack, control = _relearn(case, case["unlearned"])
    assert res.baseline["unlearned"]["k"] == 0.0 < res.baseline["original"]["k"]  # the facts were "forgotten"
    pa, pc = attack.extra["prob"], control.extra["prob"]
    # relearning 4 rows brings the answer probability of the 10 others most of the way back, beyond the control
    assert pa["share"] > 0.4 and pa["share"] > pc["share"] + 0.1, (pa, pc)
    assert attack.k_attacked > attack.k_unlearned  # and some held-out facts come back in the greedy answers
    assert res.verdict["relearn"]["variant"] == attack.variant


def test_model_never_trained_on_the_facts_recovers_nothing(case):
    _, attack, control = _relearn(case, case["never"])
    for row in (attack, control):
        assert row.extra["prob"]["share"] < 0.1, row.extra  # vs the original's 0.98 answer probability
        assert row.k_attacked <= 0.1  # no held-out fact beyond a lucky guess
    assert attack.extra["prob"]["attacked"] - control.extra["prob"]["attacked"] < 0.1


# ---------------------------------------------------------------- end to end: CLI, files, every attack
@pytest.fixture(scope="module")
def saved(case, tmp_path_factory):
    """The case's models and world on disk."""
    from obliviate.data.synthetic import write_world
    from obliviate.modeling.load import save_model

    root = tmp_path_factory.mktemp("audit_case")
    for name in ("original", "unlearned", "never"):
        save_model(root / name, case[name], case["tok"])
    write_world(case["world"], root / "world")
    return root


def test_cli_audit_writes_verdict_for_every_attack(saved, tmp_path, capsys):
    from obliviate.cli import main

    world, out = saved / "world", tmp_path / "audit"
    tmp_path = saved
    argv = ["audit", "--model", str(tmp_path / "unlearned"), "--original", str(tmp_path / "original"),
            "--retain-model", str(tmp_path / "never"), "--data", str(world), "--forget-split", "forget25",
            "--output", str(out), "max_new_tokens=16", "relearn_steps=2", f"max_length={ML}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "obliviate audit" in printed and "recovered" in printed
    data = json.loads((out / "audit.json").read_text())
    assert set(data["verdict"]) == {"relearn", "quantize", "paraphrase", "mia"}
    variants = {r["variant"] for r in data["rows"]}
    assert {"rtn_int8", "rtn_int4", "nf4", "fp4", "gguf_q4_0", "paraphrased_question", "few_shot", "completion",
            "loss"} <= variants
    assert all(r["ref0"] == "retain model under the same attack" for r in data["rows"])
    mia = next(r for r in data["rows"] if r["variant"] == "loss")
    assert 0.0 <= mia["k_attacked"] <= 1.0 and set(mia["extra"]["auc"]) == {"original", "unlearned", "retain"}
    assert mia["interval"] is None  # an AUC is no mean over rows
    for r in data["rows"]:  # every other share has its interval over the rows, in order
        if r["attack"] != "mia" and r["share"] is not None:
            assert len(r["interval"]) == 2 and r["interval"][0] <= r["interval"][1], r
    assert data["verdict"]["relearn"]["interval"] == next(r["interval"] for r in data["rows"] if r["headline"]
                                                          and r["attack"] == "relearn")
    assert "| attack |" in (out / "report.md").read_text() and "<table>" in (out / "report.html").read_text()
    assert main(argv) == 2  # an existing output is refused (--overwrite replaces it)
    assert "exists" in capsys.readouterr().err


def test_run_config_audit_without_retain_model(saved):
    """An `audit:` section of a run: the saved model against model.path; 0% = the unlearned model without attack."""
    import dataclasses

    from obliviate.audit.run import audit_run_output

    cfg = AuditConfig(enabled=True, attacks=["quantize", "paraphrase"], probes=["completion"],
                      quant_schemes=["rtn_int4"], max_new_tokens=16, max_length=ML)
    res = audit_run_output(cfg, str(saved / "unlearned"), str(saved / "original"), str(saved / "world"), "forget25",
                           log=lambda s: None)
    assert (saved / "unlearned" / "audit" / "audit.json").is_file()
    assert [r.variant for r in res.rows] == ["rtn_int4", "completion"]
    for r in res.rows:
        assert r.ref0 == "unlearned model without attack" and r.k_ref0 == r.k_unlearned
        assert r.share_without_attack in (0.0, None)
    assert dataclasses.asdict(cfg)["attacks"] == ["quantize", "paraphrase"]  # the section is plain data


def test_audit_package_and_cli_parser_load_no_torch():
    code = ("import sys, obliviate.audit, obliviate.cli.audit, obliviate.cli; obliviate.cli.parser(); "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
