"""Refusals for IDK-style objectives: drawn per access (per optimizer step) or once per example, seeded."""
import pytest
import torch

from obliviate.data.refusals import RefusalTwins, draw_refusals


def _twins(draw, n=40, k=5, seed=3):
    return RefusalTwins(lambda q, a: (q, a), [f"q{i}" for i in range(n)], [f"r{j}" for j in range(k)], seed, draw)


def test_per_access_draws_a_fresh_seeded_refusal_each_step():
    t = _twins("per_access")
    s0, s1 = t.choice(0), t.choice(1)
    assert s0 == t.choice(0) and s0 != s1  # seeded by step: a resume at step 1 redraws s1 exactly
    g = torch.Generator().manual_seed(3 * 1_000_003 + 1)
    assert s1 == torch.randint(5, (40,), generator=g).tolist()
    assert t.at(1)[7] == ("q7", f"r{s1[7]}") and len(t.at(1)) == 40
    assert sum(a != b for a, b in zip(s0, s1)) > 20  # most questions change refusal between steps
    assert set(s0 + s1) == set(range(5))
    assert draw_refusals(40, 5, 4, 1) != s1  # another seed, another draw


def test_per_example_keeps_one_refusal_per_question_for_the_run():
    t = _twins("per_example")
    assert t.choice(0) == t.choice(9) == torch.randint(5, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    assert t.fingerprint_rows() == [("q%d" % i, "r%d" % k) for i, k in enumerate(t.choice(0))]


def test_an_unknown_draw_is_refused():
    with pytest.raises(ValueError, match=r"must be one of \['per_access', 'per_example'\]"):
        _twins("per_epoch")


def test_the_config_checks_the_draw():
    from obliviate.config import MethodConfig
    from obliviate.errors import ConfigError

    with pytest.raises(ConfigError, match="method.refusal_draw"):
        MethodConfig(refusal_draw="sometimes")
    assert MethodConfig().refusal_draw == "per_access"


def test_the_loop_sees_a_new_refusal_for_the_same_question_at_the_next_step(monkeypatch, small_world, small_tok,
                                                                             trained_small):
    """idk over 3 steps of one forget question: per_access trains on several refusals, per_example on one."""
    import copy
    from dataclasses import replace

    from obliviate.config import MethodConfig, TrainConfig
    from obliviate.objectives import FORGET
    from obliviate.train.unlearn import unlearn

    spec, seen = FORGET.get("idk"), []

    def spy(policy, refusal, *, reduction="token"):
        seen[-1].append(tuple(refusal.targets[0][refusal.mask[0]].tolist()))
        return spec.fn(policy, refusal, reduction=reduction)

    monkeypatch.setitem(FORGET._items, "idk", replace(spec, fn=spy))
    rows = small_world.splits["forget10"][:1]
    for draw in ("per_access", "per_example"):
        seen.append([])
        unlearn(copy.deepcopy(trained_small), small_tok, rows, [], MethodConfig(forget="idk", retain=None,
                refusal_draw=draw), TrainConfig(max_steps=6, batch_size=1, progress=False), max_length=64)
    per_access, per_example = seen
    assert len(set(per_example)) == 1 and len(set(per_access)) > 1
