"""The θ0 cache (method.cache): cached runs equal live runs; top-k with k = V equals exact; the limit."""
import copy
from pathlib import Path
from unittest import mock

import pytest
import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.errors import ConfigError
from obliviate.modeling import cache as cache_mod
from obliviate.train.unlearn import unlearn


def _cfg(**kw):
    return TrainConfig(**{"progress": False, "weight_decay": 0.0, "scheduler": "constant", "max_steps": 5,
                          "batch_size": 3, "lr": 1e-3, **kw})


def _run(model, world, tok, method, **kw):
    # 4 forget rows, batch 3, 5 steps: batches wrap the epoch, so later batches mix cached and new rows
    forget, retain = world.splits["forget10"][:4], world.splits["retain90"][:12]
    unlearn(model, tok, forget, retain, method, _cfg(**kw), max_length=64)
    return model


def _method(name, **kw):
    base = {"asu_kl": {"forget": "asu", "forget_args": {"tau": 3.0, "layers": [0]}, "retain": "kl"},
            "npo": {"forget": "npo", "retain": "nll"},
            "dpo": {"forget": "dpo", "retain": "nll"},
            "graddiff_kl": {"forget": "ga", "retain": "kl"}}[name]
    return MethodConfig(**base, **kw)


@pytest.fixture
def hits(monkeypatch):
    """Counts batches served from the cache (so a test cannot pass with the cache never used)."""
    seen = []
    real = cache_mod.RoleCache._build

    def counted(self, *a, **kw):
        seen.append(self.kind)
        return real(self, *a, **kw)

    monkeypatch.setattr(cache_mod.RoleCache, "_build", counted)
    return seen


@pytest.mark.parametrize("name", ["asu_kl", "npo", "dpo", "graddiff_kl"])
def test_cached_run_equals_live_run(name, hits, small_world, small_tok, trained_small):
    live = _run(copy.deepcopy(trained_small).double(), small_world, small_tok, _method(name, cache="none"))
    assert not hits
    cached = _run(copy.deepcopy(trained_small).double(), small_world, small_tok, _method(name, cache="exact"))
    assert hits and set(hits) <= {"exact", "scalar"} and ("scalar" in hits) == (name in ("npo", "dpo"))
    for a, b in zip(live.parameters(), cached.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    assert any(not torch.equal(a, p0.double()) for a, p0 in zip(live.parameters(), trained_small.parameters()))


def test_cached_run_equals_live_run_float32(hits, small_world, small_tok, trained_small):
    live = _run(copy.deepcopy(trained_small), small_world, small_tok, _method("asu_kl", cache="none"), max_steps=3)
    cached = _run(copy.deepcopy(trained_small), small_world, small_tok, _method("asu_kl"), max_steps=3)  # auto
    assert hits
    for a, b in zip(live.parameters(), cached.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_topk_with_k_equal_vocab_equals_exact(small_world, small_tok, trained_small):
    vocab = trained_small.get_output_embeddings().weight.shape[0]
    exact = _run(copy.deepcopy(trained_small).double(), small_world, small_tok, _method("asu_kl", cache="exact"))
    topk = _run(copy.deepcopy(trained_small).double(), small_world, small_tok,
                _method("asu_kl", cache="topk", cache_topk=vocab))
    for a, b in zip(exact.parameters(), topk.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)


def test_memory_limit_refuses_naming_the_keys(small_world, small_tok, trained_small, capsys):
    with pytest.raises(ConfigError, match=r"method\.cache_max_gb=1e-09.*method\.cache=none"):
        _run(copy.deepcopy(trained_small), small_world, small_tok, _method("asu_kl", cache="exact", cache_max_gb=1e-9))
    out = capsys.readouterr().err
    assert "asu teacher exact:" in out and "answer tokens ×" in out and "vocab × 4 B" in out  # printed first


def test_auto_over_the_limit_runs_live_without_spilling(hits, small_world, small_tok, trained_small):
    _run(copy.deepcopy(trained_small), small_world, small_tok, _method("asu_kl", cache_max_gb=1e-9, cache_spill=False),
         max_steps=3)
    assert not hits


def test_auto_over_the_limit_spills_to_disk_memory_mapped(hits, small_world, small_tok, trained_small, tmp_path,
                                                          capsys, monkeypatch):
    """Over cache_max_gb, auto keeps the caches on disk (one file per example, loaded with mmap=True): the run
    equals a live run, reads every batch after the first from the files, and leaves no folder behind."""
    loads = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loads.append(kw.get("mmap")) or real(*a, **kw))
    live = _run(copy.deepcopy(trained_small).double(), small_world, small_tok, _method("asu_kl", cache="none"))
    spilled = _run(copy.deepcopy(trained_small).double(), small_world, small_tok,
                   _method("asu_kl", cache_max_gb=1e-9, cache_dir=str(tmp_path)))
    err = capsys.readouterr().err
    assert err.count("kept on disk in " + str(tmp_path)) == 2 and "memory-mapped" in err  # teacher and reference
    assert hits and set(hits) == {"exact"} and loads and all(loads)
    for a, b in zip(live.parameters(), spilled.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    import gc

    gc.collect()
    assert list(tmp_path.iterdir()) == []  # the run's folder went with its caches


def test_the_estimate_counts_only_the_rows_the_run_uses(small_world, small_tok, trained_small, capsys):
    """2 steps of batch 3 touch 6 of 30 retain rows: the reference cache is sized for those 6 rows."""
    from obliviate.train.unlearn import _count, encode_rows, planned_rows

    retain = small_world.splits["retain90"][:30]
    unlearn(copy.deepcopy(trained_small), small_tok, small_world.splits["forget10"][:4], retain,
            _method("graddiff_kl"), _cfg(max_steps=2), max_length=64)
    _, used = planned_rows(4, 30, 3, 0, 2)
    assert len(used) == 6
    enc = encode_rows(small_tok, retain, 64)
    tokens = sum(_count(enc[i], "targets") for i in used)
    assert f"kl reference exact: {tokens} answer tokens ×" in capsys.readouterr().err
    assert tokens < sum(_count(e, "targets") for e in enc) / 3


def test_the_estimate_counts_every_accumulated_micro_batch(small_world, small_tok, trained_small, capsys):
    """2 steps of 2 accumulated micro-batches of 3 touch 12 of 30 retain rows: the cache is sized for those 12."""
    from obliviate.train.unlearn import _count, encode_rows, planned_rows

    retain = small_world.splits["retain90"][:30]
    unlearn(copy.deepcopy(trained_small), small_tok, small_world.splits["forget10"][:4], retain,
            _method("graddiff_kl"), _cfg(max_steps=2, grad_accum=2), max_length=64)
    _, used = planned_rows(4, 30, 3, 0, 4)
    assert len(used) == 12
    enc = encode_rows(small_tok, retain, 64)
    tokens = sum(_count(enc[i], "targets") for i in used)
    assert f"kl reference exact: {tokens} answer tokens ×" in capsys.readouterr().err


def test_bad_cache_settings_are_config_errors(small_world, small_tok, trained_small):
    with pytest.raises(ConfigError, match="method.cache must be one of"):
        _run(copy.deepcopy(trained_small), small_world, small_tok, _method("asu_kl", cache="yes"))
    with pytest.raises(ConfigError, match="topk approximates a KL"):
        _run(copy.deepcopy(trained_small), small_world, small_tok, MethodConfig(forget="undial", retain="nll", cache="topk"))


def test_auto_keeps_the_caches_that_fit(small_world, small_tok, trained_small, capsys):
    from obliviate.modeling.cache import CacheBudget

    budget = CacheBudget("auto", 1e-3, 64, False)
    small, big = budget.role("asu", "teacher", 10, "kl"), budget.role("kl", "reference", 1000, "kl")
    budget.ensure(512, torch.float32)  # 10·512·4 B fits in 1 MB, 1000·512·4 B does not
    assert (small.kind, big.kind) == ("exact", "off") and "kl reference computed live" in capsys.readouterr().err


def test_a_cache_pool_serves_the_next_run_on_the_same_rows_and_equals_a_live_run(hits, small_world, small_tok,
                                                                                  trained_small):
    """A sweep's trials share θ0's caches: the second run is served from the first run's entries (no frozen forward
    for them) and ends on the same weights as a live run; another teacher gets its own cache."""
    forget, retain = small_world.splits["forget10"][:4], small_world.splits["retain90"][:12]
    pool = cache_mod.CachePool()
    first = copy.deepcopy(trained_small).double()
    unlearn(first, small_tok, forget, retain, _method("asu_kl", cache="exact"), _cfg(), max_length=64, cache_pool=pool)
    assert len(pool) == 2  # the ASU teacher (forget side) and the KL reference (retain side)
    stored = {k: len(c.store) for k, c in pool.items()}
    lives = []
    real_live = cache_mod.RoleCache.get

    def counting(self, batch, idx, policy_model, live, force_live=False):
        return real_live(self, batch, idx, policy_model, lambda: lives.append(1) or live(), force_live)

    second = copy.deepcopy(trained_small).double()
    with mock.patch.object(cache_mod.RoleCache, "get", counting):
        unlearn(second, small_tok, forget, retain, _method("asu_kl", cache="exact"), _cfg(), max_length=64,
                cache_pool=pool)
    assert len(pool) == 2 and all(len(c.store) >= stored[k] for k, c in pool.items())
    assert lives == []  # the same seeded batches: every θ0 statistic came from the first run's entries
    live = _run(copy.deepcopy(trained_small).double(), small_world, small_tok, _method("asu_kl", cache="none"))
    for a, b in zip(live.parameters(), second.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    other = _method("asu_kl", cache="exact")
    other = MethodConfig(**{**other.__dict__, "forget_args": {"tau": 5.0, "layers": [0]}})
    unlearn(copy.deepcopy(trained_small).double(), small_tok, forget, retain, other, _cfg(), max_length=64,
            cache_pool=pool)
    assert len(pool) == 3  # a new teacher cache; the reference cache is shared


def test_a_cache_pool_keeps_at_most_its_limit_least_recently_used_out():
    pool = cache_mod.CachePool(max_entries=2)
    for k in "abc":
        pool[k] = k
    assert list(pool) == ["b", "c"]
    assert pool.take("b") == "b" and pool.take("z") is None
    pool["d"] = "d"
    assert list(pool) == ["b", "d"]  # c was used last before b: it leaves


def _filled(n_floats: int, spilled: bool = False) -> cache_mod.RoleCache:
    budget = cache_mod.CacheBudget("exact", 1.0, 8, False)
    cache = cache_mod.RoleCache("asu teacher", "exact", n_floats, budget)
    cache.store[0] = Path("spilled.pt") if spilled else (torch.zeros(n_floats // 2), torch.zeros(n_floats - n_floats // 2))
    return cache


def test_a_cache_pool_keeps_what_earlier_runs_filled_under_its_memory_bound():
    """4 B a float: 3 filled caches of 100 floats are 1,200 B; under a 1,000 B bound the oldest leaves when a fourth
    cache (still empty: it fills during its run) comes, and spilled entries count nothing."""
    assert cache_mod.cache_bytes(_filled(100)) == 400 and cache_mod.cache_bytes(_filled(100, spilled=True)) == 0
    pool = cache_mod.CachePool(max_entries=8, max_gb=1000 / 1e9)
    for k in "abc":
        pool[k] = _filled(100)
    assert list(pool) == ["a", "b", "c"] and pool.stored_bytes() == 1200  # checked when an entry comes, not after
    pool.take("a")
    pool["d"] = cache_mod.RoleCache("kl reference", "exact", 0, cache_mod.CacheBudget("exact", 1.0, 8, False))
    assert list(pool) == ["c", "a", "d"]  # b, the least recently used, left: 800 B ≤ 1,000 B
    pool["e"] = _filled(100, spilled=True)
    assert list(pool) == ["c", "a", "d", "e"]
    pool["f"] = _filled(1000)
    assert list(pool) == ["c", "a", "d", "e", "f"]  # the newest is never counted against the bound
    pool["g"] = _filled(1)
    assert list(pool) == ["g"]  # f alone holds 4,000 B: every cache before g leaves
