"""Continual unlearning (docs/METHODS.md §1.5): requests cut by author, θ0 chained, earlier requests re-evaluated."""
import copy

import pytest
import torch

from obliviate import continual
from obliviate.config import MethodConfig, TrainConfig, build
from obliviate.continual import ContinualConfig, ContinualResult, continual_table, run_continual, split_requests
from obliviate.data.rows import QARow
from obliviate.errors import ConfigError


@pytest.fixture(scope="module")
def world30():
    """The small world's 10 authors with forget30 = 3 authors (15 rows each)."""
    from obliviate.data.synthetic import make_world

    return make_world(10, seed=1, forget_percents=(30,))


def _cfg(**kw):
    return TrainConfig(**{"progress": False, "weight_decay": 0.0, "scheduler": "constant", "batch_size": 4,
                          "lr": 1e-3, "max_steps": 2, **kw})


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_split_by_author_in_order(world30):
    forget = world30.splits["forget30"]
    reqs = split_requests(forget, 3)
    assert [len({r.author for r in req}) for req in reqs] == [1, 1, 1]
    assert [r for req in reqs for r in req] == list(forget)
    assert len({req[0].author for req in reqs}) == 3
    assert split_requests(forget) == reqs  # one author per request by default
    assert split_requests(forget, authors_per_request=3) == [list(forget)]
    assert split_requests(forget, 1, authors_per_request=3) == [list(forget)]


def test_rows_without_author_use_tofu_blocks_of_20():
    rows = [QARow(f"q{i}?", f"a{i}.") for i in range(60)]
    reqs = split_requests(rows, 3)
    assert [len(r) for r in reqs] == [20, 20, 20] and reqs[1][0].question == "q20?"
    with pytest.raises(ValueError, match="multiple of 20"):
        split_requests(rows[:50], 1)


@pytest.mark.parametrize("n, per, match", [
    (2, None, r"into 2 equal requests; requests must be one of \[1, 3\]"),
    (4, None, "into 4 equal requests"),
    (0, None, "requests=0 is impossible"),
    (None, 2, "requests of 2 authors"),
    (None, 0, "authors_per_request=0 is impossible"),
    (3, 3, "set only one"),
])
def test_impossible_counts_raise(world30, n, per, match):
    with pytest.raises(ValueError, match=match):
        split_requests(world30.splits["forget30"], n, authors_per_request=per)


def test_empty_and_mixed_authors_raise(world30):
    with pytest.raises(ValueError, match="empty"):
        split_requests([], 1)
    rows = list(world30.splits["forget30"][:3]) + [QARow("q?", "a.")]
    with pytest.raises(ValueError, match="no `author`"):
        split_requests(rows)


def test_config_builds_validates_and_splits(world30):
    cfg = build(ContinualConfig, {"requests": 3, "eval_every": 2})
    assert cfg.enabled and not ContinualConfig().enabled
    assert len(split_requests(world30.splits["forget30"], cfg.requests, authors_per_request=cfg.authors_per_request)) == 3
    with pytest.raises(ConfigError, match="continual.eval_every"):
        ContinualConfig(eval_every=0)
    with pytest.raises(ConfigError, match="continual.requests"):
        ContinualConfig(requests=0)


def test_asu_chains_theta0_and_reevaluates_every_request(world30, small_tok, trained_small, monkeypatch):
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.train import unlearn as frozen_mod  # the FrozenModels that unlearn() builds

    teachers, after = [], []

    class Recording(FrozenModels):
        def __init__(self, model, teacher, **kw):
            super().__init__(model, teacher, **kw)
            teachers.append(_params(self.model))  # the frozen copy actually used as teacher / reference

    def unlearn_and_record(model, *args, **kw):
        res = real_unlearn(model, *args, **kw)
        after.append(_params(model))
        return res

    real_unlearn = continual.unlearn
    monkeypatch.setattr(frozen_mod, "FrozenModels", Recording)
    monkeypatch.setattr(continual, "unlearn", unlearn_and_record)
    model = copy.deepcopy(trained_small)
    start = _params(model)
    reqs = split_requests(world30.splits["forget30"], 3)
    method = MethodConfig(forget="asu", forget_args={"tau": 4.0, "layers": [0]}, retain="kl")
    lines = []
    res = run_continual(model, small_tok, reqs, world30.splits["retain70"], method, _cfg(), max_length=64,
                        log=lines.append, config=ContinualConfig(max_new_tokens=8))
    assert len(teachers) == len(after) == 3
    assert _same(teachers[0], start) and not _same(after[0], start)
    for i in (1, 2):  # request i+1's teacher is the model after request i, never a stale θ0
        assert _same(teachers[i], after[i - 1]) and not _same(teachers[i], teachers[i - 1])
    assert [len(h) for h in res.histories] == [2, 2, 2] and len(res.seconds) == 3
    assert [s["request"] for s in res.steps] == [1, 2, 3]
    for k, step in enumerate(res.steps):
        assert [f["request"] for f in step["forget"]] == list(range(1, k + 2))
        assert all(0 <= f["rougeL_recall"] <= 1 and f["fact_recall"] is not None for f in step["forget"])
        assert step["retain"]["nll"] > 0 and 0 <= step["retain"]["rougeL_recall"] <= 1
    table = continual_table(res).splitlines()
    assert table[0].startswith("| after request | forget ROUGE-L r1 |") and len(table) == 5
    assert table[2].count("–") == 2 and "–" not in table[4]
    assert any("after request 3" in line for line in lines)


def test_graddiff_eval_every_and_checkpoint_dirs(world30, small_tok, trained_small, tmp_path):
    reqs = split_requests(world30.splits["forget30"], 3)
    calls = []

    def eval_fn(model, i, seen):
        calls.append((i, len(seen)))
        return {"seen_rows": sum(len(s) for s in seen)}

    res = run_continual(copy.deepcopy(trained_small), small_tok, reqs, world30.splits["retain70"],
                        MethodConfig(forget="ga", retain="nll"),
                        _cfg(checkpoint_dir=str(tmp_path), checkpoint_every=1), max_length=64,
                        eval_fn=eval_fn, log=lambda s: None, config=ContinualConfig(eval_every=2))
    assert calls == [(1, 2), (2, 3)] and [s["request"] for s in res.steps] == [2, 3]
    assert res.steps[-1]["seen_rows"] == 45
    assert sorted(p.name for p in tmp_path.iterdir()) == ["request_01", "request_02", "request_03"]
    assert "| 3 | – | – | – | – | – |" in continual_table(res)


def test_run_continual_rejects_bad_requests(small_tok, trained_small):
    with pytest.raises(ValueError, match="no forget requests"):
        run_continual(trained_small, small_tok, [], [], MethodConfig(), _cfg())
    with pytest.raises(ValueError, match=r"request\(s\) \[2\] are empty"):
        run_continual(trained_small, small_tok, [[QARow("q?", "a.")], []], [], MethodConfig(), _cfg())
    with pytest.raises(ValueError, match="needs QA rows"):
        run_continual(trained_small, small_tok, [["some raw text"]], [], MethodConfig(), _cfg())
    assert continual_table(ContinualResult()).count("\n") == 1  # header only


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_lora_student_rebases_theta0_on_the_last_result(world30, small_tok, trained_small, monkeypatch):
    from obliviate.data.tokenize import collate, pad_id
    from obliviate.modeling.frozen import FrozenModels
    from obliviate.modeling.logprobs import forward_stats
    from obliviate.modeling.lora import apply_lora
    from obliviate.train import unlearn as frozen_mod  # the FrozenModels that unlearn() builds
    from obliviate.train.unlearn import encode_rows

    batch = collate(encode_rows(small_tok, world30.splits["forget30"][:4], 64), pad_id(small_tok))
    theta0, after = [], []

    class Recording(FrozenModels):
        def __init__(self, model, teacher, **kw):
            super().__init__(model, teacher, **kw)
            theta0.append(self.reference_stats(batch).logits)  # adapters-off: LoRA's θ0

    def unlearn_and_record(model, *args, **kw):
        res = real_unlearn(model, *args, **kw)
        with torch.no_grad():
            after.append(forward_stats(model.eval(), batch).logits)
        return res

    real_unlearn = continual.unlearn
    monkeypatch.setattr(frozen_mod, "FrozenModels", Recording)
    monkeypatch.setattr(continual, "unlearn", unlearn_and_record)
    student = apply_lora(copy.deepcopy(trained_small), r=4, alpha=8, dropout=0.0, target_modules=None)
    reqs = split_requests(world30.splits["forget30"], authors_per_request=1)[:2]
    run_continual(student, small_tok, reqs, world30.splits["retain70"],
                  MethodConfig(forget="asu", forget_args={"tau": 4.0, "layers": [0]}, retain="kl"),
                  _cfg(lr=1e-2), max_length=64, eval_fn=lambda m, i, seen: {}, log=lambda s: None)
    torch.testing.assert_close(theta0[1], after[0], atol=1e-5, rtol=1e-5)  # not the untouched base model
    assert not torch.allclose(theta0[1], theta0[0], atol=1e-4)
