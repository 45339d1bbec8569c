"""The audit's relearning attack (audit/core.py): its 0% reference is the retain model put through the SAME
relearning as the attacked model (same rows, same settings), then measured on the same held-out rows."""
from __future__ import annotations

import numpy as np
import pytest

from obliviate.audit import core
from obliviate.audit.probes import answer_probs, direct_probe, item_scores, mean_k
from obliviate.config.audit import AuditConfig

ML = 48


@pytest.fixture(scope="module")
def world():
    """A 4-author world (forget25 = 1 author, 14 QA) and three untrained tiny Llamas: the audit's arithmetic
    needs models that differ, not models that know anything."""
    from obliviate.data.synthetic import corpus_texts, make_world
    from obliviate.modeling.tiny import tiny_llama, train_tokenizer

    w = make_world(4, seed=1, forget_percents=(25,))
    tok = train_tokenizer(corpus_texts(w), vocab_size=300)
    models = {name: tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, seed=seed).eval()
              for seed, name in enumerate(("original", "unlearned", "retain"))}
    return {"tok": tok, "forget": w.splits["forget25_perturbed"], "retain_rows": w.splits["retain75"], **models}


def test_relearn_reference_is_the_retain_model_relearned_the_same_way(world, monkeypatch):
    cfg = AuditConfig(attacks=["relearn"], relearn_share=0.3, relearn_lr=1e-2, relearn_steps=2, max_new_tokens=8,
                      max_length=ML)
    calls = []

    def spy(model, tokenizer, rows, c):
        copy = real(model, tokenizer, rows, c)
        calls.append((model, list(rows), c, copy))
        return copy

    real = core.relearned_copy
    monkeypatch.setattr(core, "relearned_copy", spy)
    tok, forget = world["tok"], world["forget"]
    res = core.run_audit(world["unlearned"], world["original"], tok, forget, retain_rows=world["retain_rows"],
                         retain_model=world["retain"], cfg=cfg, log=lambda s: None)
    assert res.ref0 == core.REF_RETAIN
    # per variant: the unlearned model, then the retain model, relearned on the same rows with the same settings
    assert [c[0] for c in calls] == [world["unlearned"], world["retain"]] * 2
    for (_, rows_u, cfg_u, _), (_, rows_r, cfg_r, _) in (calls[0:2], calls[2:4]):
        assert rows_r == rows_u and cfg_r is cfg_u is cfg
    _, ev = core.relearn_split(len(forget), cfg.relearn_share, cfg.seed)
    eval_rows = [forget[i] for i in ev]
    pkw = {"batch_size": cfg.batch_size, "max_length": ML}
    untouched = float(answer_probs(world["retain"], tok, eval_rows, **pkw).mean())
    for row, (_, _, _, ref) in zip(res.rows, (calls[1], calls[3])):
        # the 0% reference is measured on the relearned retain copy, and relearning moved it
        p_ref = float(answer_probs(ref, tok, eval_rows, **pkw).mean())
        assert row.extra["prob"]["ref0"] == pytest.approx(p_ref, rel=1e-9)
        assert abs(p_ref - untouched) > 1e-4 * untouched
        probe = direct_probe(tok, eval_rows)
        gens = core.greedy_from_ids(ref, tok, probe.prompts, max_new_tokens=cfg.max_new_tokens,
                                    batch_size=cfg.batch_size, max_length=ML)
        k = mean_k(item_scores(gens, eval_rows, probe, res.k_metric))
        assert row.k_ref0 == k or (row.k_ref0 is None and k is None) or np.isclose(row.k_ref0, k)
