"""The one log-prob module: alignment, masking and reductions on hand-made logits."""
import copy
import math

import pytest
import torch

from obliviate.modeling.logprobs import kl_per_token, sequence_mean, shift_labels, token_stats


def test_uniform_logits_give_log_vocab():
    # 4-way uniform: every counted token has log-prob -ln 4; two answer tokens -> logp = -2 ln 4, nll = ln 4
    labels = torch.tensor([[-100, 1, 2, -100]])
    s = token_stats(torch.zeros(1, 4, 4), labels)
    assert s.mask.tolist() == [[True, True, False]]
    assert s.logp.item() == pytest.approx(-2 * math.log(4))
    assert s.nll.item() == pytest.approx(math.log(4))


def test_shift_alignment_position_t_predicts_t_plus_1():
    # logits at position 0 put all mass on token 3; the label at position 1 is 3 -> log-prob ~ 0
    logits = torch.full((1, 2, 4), -30.0)
    logits[0, 0, 3] = 30.0
    s = token_stats(logits, torch.tensor([[-100, 3]]))
    assert s.token_logp[0, 0].item() == pytest.approx(0.0, abs=1e-6)


def test_empty_answer_is_zero_not_nan():
    s = token_stats(torch.zeros(1, 3, 5), torch.tensor([[-100, -100, -100]]))
    assert s.nll.item() == 0.0 and s.n_tokens.item() == 1.0


def test_kl_and_sequence_mean_hand_values():
    p = torch.tensor([0.5, 0.5]).log()
    q = torch.tensor([0.25, 0.75]).log()
    assert kl_per_token(p, q).item() == pytest.approx(0.143841, abs=1e-6)
    vals = torch.tensor([[1.0, 3.0, 100.0]])
    assert sequence_mean(vals, torch.tensor([[True, True, False]])).item() == pytest.approx(2.0)


def test_shift_labels_masks_ignored():
    t, m = shift_labels(torch.tensor([[9, -100, 4]]))
    assert t.tolist() == [[0, 4]] and m.tolist() == [[False, True]]


def test_forward_stats_runs_the_head_on_answer_rows_only_without_changing_values(trained_small, small_tok):
    """The LM head sees [1, N, H] (N answer tokens, row-major); log-probs, NLL, KL, ME and UNDIAL equal the full forward's."""
    from obliviate.data.tokenize import collate, encode_qa
    from obliviate.modeling.logprobs import forward_stats, masked_token_kl
    from obliviate.modeling.lora import apply_lora
    from obliviate.objectives import FORGET

    enc = [encode_qa(small_tok, "Where was Lanas Kalo born, and in which year did it happen?", "In Anvar.", 64),
           encode_qa(small_tok, "Who is Mara Quellen?", "A writer born in Tessaly in 1962.", 64)]
    batch = collate(enc, small_tok.pad_token_id)
    seen = []
    handle = trained_small.lm_head.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        fast = forward_stats(trained_small, batch)
    finally:
        handle.remove()
    with torch.no_grad():
        full = token_stats(trained_small(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                           batch["labels"])
    n = int(full.mask.sum())
    assert n < full.mask.numel() // 2  # most positions are prompt or padding here
    assert seen == [(1, n, trained_small.config.hidden_size)] and fast.packed and fast.logits.shape[0] == n
    torch.testing.assert_close(fast.logp, full.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.token_logp, full.token_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.answer_log_probs(), full.answer_log_probs(), atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.log_probs()[fast.mask], full.log_probs()[full.mask], atol=1e-5, rtol=0)
    other = copy.deepcopy(trained_small)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)
        other_full = token_stats(other(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                 batch["labels"])
    other_fast = forward_stats(other, batch)
    for red in ("token", "example"):  # packed and dense stats, alone or mixed, give the same KL
        want = masked_token_kl(other_full, full, red)
        torch.testing.assert_close(masked_token_kl(other_fast, fast, red), want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(masked_token_kl(other_full, fast, red), want, atol=1e-6, rtol=1e-5)
        assert float(want) > 1e-3
    torch.testing.assert_close(FORGET.get("me").fn(fast), FORGET.get("me").fn(full), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(FORGET.get("undial").fn(fast, other_fast), FORGET.get("undial").fn(full, other_full),
                               atol=1e-6, rtol=1e-5)
    lora = apply_lora(copy.deepcopy(trained_small), r=2, alpha=4, dropout=0.0, target_modules=["q_proj"])
    assert forward_stats(lora, batch).logits.shape == fast.logits.shape  # the hook reaches the head through PEFT


def test_packed_rows_per_example_and_spread():
    from obliviate.modeling.logprobs import packed_token_stats

    labels = torch.tensor([[-100, 1, 2, -100], [-100, -100, 3, 0]])  # answer tokens: row 0 at 0,1; row 1 at 1,2
    rows = torch.log_softmax(torch.randn(4, 5, dtype=torch.float64), -1)
    s = packed_token_stats(rows, labels)
    assert s.mask.tolist() == [[True, True, False], [False, True, True]]
    torch.testing.assert_close(s.example_rows(1), rows[2:4])
    assert s.token_logp[1, 1].item() == pytest.approx(rows[2, 3].item()) and s.token_logp[0, 2].item() == 0.0
    assert s.spread(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]]
    with pytest.raises(ValueError, match="3 logit rows for 4 answer tokens"):
        packed_token_stats(rows[:3], labels)


def test_kl_terms_with_zero_target_probability_count_zero():
    # p = (1, 0) (log p_1 = -inf), q = (1/2, 1/2): KL = 1·ln 2 + 0 = ln 2; q = (1, 0) too: 0, not NaN
    p = torch.tensor([0.0, -math.inf])
    assert kl_per_token(p, torch.tensor([0.5, 0.5]).log()).item() == pytest.approx(math.log(2), abs=1e-6)
    assert kl_per_token(p, p).item() == 0.0


@pytest.mark.parametrize("layer", [0, 1])
def test_hidden_layer_is_the_decoder_layer_output_also_for_the_last_layer(layer, trained_small, small_tok):
    """The hook returns decoder layer `layer`'s own output; hidden_states[layer + 1] agrees except for the last
    layer, where transformers records the output AFTER the final norm (what RMU must not read)."""
    from obliviate.data.tokenize import collate, encode_qa
    from obliviate.modeling.logprobs import forward_stats, hidden_at

    batch = collate([encode_qa(small_tok, "Who is Mara Quellen?", "A writer.", 64),
                     encode_qa(small_tok, "Where was Lanas Kalo born?", "In Anvar, in 1950.", 64)], 0)
    model = trained_small
    seen = []
    handle = model.model.layers[layer].register_forward_hook(lambda m, i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        stats = forward_stats(model, batch, hidden_layer=layer)
    handle.remove()
    torch.testing.assert_close(hidden_at(stats, layer), seen[0], rtol=0, atol=0)
    assert stats.hidden_mask.tolist() == (batch["labels"] != -100).tolist()  # label positions, unshifted
    if layer == 1:  # the last of 2 layers
        assert (stats.hidden - out.hidden_states[-1]).abs().max() > 1e-2
        torch.testing.assert_close(model.model.norm(stats.hidden), out.hidden_states[-1])
    else:
        torch.testing.assert_close(stats.hidden, out.hidden_states[layer + 1])
    with pytest.raises(ValueError, match="out of range"):
        forward_stats(model, batch, hidden_layer=2)
