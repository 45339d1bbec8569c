"""Which positions count (loop parameter `positions`): UNDIAL, KL and ME against their reference formulas,
rewritten here from open-unlearning's src/trainer/utils.py and closer-look's trainer/losses.py."""
import copy

import pytest
import torch
import torch.nn.functional as F

from obliviate.data.tokenize import collate, pad_id
from obliviate.modeling.logprobs import IGNORE_INDEX
from obliviate.modeling.positions import position_labels
from obliviate.objectives import FORGET, RETAIN


def test_position_labels_by_hand():
    batch = {"input_ids": torch.tensor([[5, 6, 7, 8], [5, 9, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]),
             "labels": torch.tensor([[-100, -100, 7, 8], [-100, 9, -100, -100]])}
    wrap = 300 - 100
    out = position_labels(batch, "batch", pad=0, vocab_size=300, max_length=6)
    assert out["labels"].tolist() == [[wrap, wrap, 7, 8], [wrap, 9, wrap, wrap]]
    assert torch.equal(out["input_ids"], batch["input_ids"])
    out = position_labels(batch, "batch", pad=0, vocab_size=300, max_length=6, last=True)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 0], [5, 9, 0, 0, 0]]
    assert out["attention_mask"][:, -1].tolist() == [0, 0] and out["labels"][:, -1].tolist() == [wrap, wrap]
    out = position_labels(batch, "max_length", pad=3, vocab_size=300, max_length=6)
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 3, 3], [5, 9, 0, 0, 3, 3]]
    assert out["labels"].tolist() == [[wrap, wrap, 7, 8, wrap, wrap], [wrap, 9, wrap, wrap, wrap, wrap]]
    seq = position_labels(batch, "sequence", pad=0, vocab_size=300, max_length=6)
    assert seq["labels"].tolist() == [[5, 6, 7, 8], [5, 9, -100, -100]]
    assert position_labels(batch, "answer", pad=0, vocab_size=300, max_length=6)["labels"] is batch["labels"]


@pytest.fixture
def pair(trained_small):
    """(student, FrozenModels) where the student has moved away from θ0, in float64."""
    from obliviate.modeling.frozen import FrozenModels

    student = copy.deepcopy(trained_small).double()
    frozen = FrozenModels(student, None)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return student, frozen


def _side(registry, name, tok, rows, args, max_length=64):
    from obliviate.train.unlearn import Side, encode_rows

    spec = registry.get(name)
    loss_kw, loop = spec.resolve(args)
    return Side(spec, loss_kw, 1.0, encode_rows(tok, rows, max_length), None, loop, max_length)


def test_undial_batch_positions_equal_open_unlearnings_formula(pair, small_world, small_tok):
    from accelerate import Accelerator

    student, frozen = pair
    rows = small_world.splits["forget10"][:3]
    pad = pad_id(small_tok)
    beta = 3.0
    side = _side(FORGET, "undial", small_tok, rows, {"beta": beta, "positions": "batch"})
    with torch.no_grad():
        ours = side.loss(student, frozen, [0, 1, 2], Accelerator(cpu=True), pad)
        batch = collate(side.enc, pad)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        logits = student(**inputs).logits[:, :-1]
        teacher = frozen.model(**inputs).logits[:, :-1]
        labels = batch["labels"][:, 1:]
        mask = torch.zeros_like(teacher)  # one-hot of the label; a -100 label indexes id V - 100
        mask[torch.arange(mask.shape[0]).view(-1, 1, 1), torch.arange(mask.shape[1]).view(1, -1, 1),
             labels.unsqueeze(-1)] = 1.0
        soft = torch.softmax(teacher - beta * mask, -1)
        ref = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), soft.reshape(-1, soft.shape[-1]),
                              reduction="none").mean()
        answer = _side(FORGET, "undial", small_tok, rows, {"beta": beta}).loss(student, frozen, [0, 1, 2],
                                                                               Accelerator(cpu=True), pad)
        # inside a run the loop passes the optimizer step's rows; "batch" positions still average over the
        # micro-batch's own positions (not the step's answer-token count, which only "answer" pools by)
        in_step = side.loss(student, frozen, [0, 1, 2], Accelerator(cpu=True), pad, step=([0, 1, 2], 1))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(in_step, ref, rtol=1e-10, atol=1e-10)
    assert abs(answer.item() - ref.item()) > 1e-3  # answer tokens only is another number


def test_kl_batch_positions_equal_open_unlearnings_kl_div_over_every_logit(pair, small_world, small_tok):
    from accelerate import Accelerator

    student, frozen = pair
    rows = small_world.splits["retain90"][:3]
    pad = pad_id(small_tok)
    side = _side(RETAIN, "kl", small_tok, rows, {"positions": "batch"})
    with torch.no_grad():
        ours = side.loss(student, frozen, [0, 1, 2], Accelerator(cpu=True), pad)
        batch = collate(side.enc, pad)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        cur = F.log_softmax(student(**inputs).logits, -1)
        ref_lp = F.log_softmax(frozen.model(**inputs).logits, -1)
        V = cur.shape[-1]
        ref = F.kl_div(cur.reshape(-1, V), ref_lp.reshape(-1, V), reduction="batchmean", log_target=True)
        answer = _side(RETAIN, "kl", small_tok, rows, {}).loss(student, frozen, [0, 1, 2], Accelerator(cpu=True), pad)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    assert abs(answer.item() - ref.item()) > 1e-4


def asu_released_kl(student, frozen, ids, att):
    """The ASU authors' TOFU retain term as released (Right-to-be-forgotten trainer/losses.py, the second `kl_loss`
    definition, which Python keeps), rewritten here: log-softmax of every logit of rows padded to max_length, no
    shift, kl_div(student, θ0, batchmean, log_target) over the flattened [B·T, V] rows."""
    V = student.config.vocab_size
    cur = F.log_softmax(student(input_ids=ids, attention_mask=att).logits, -1).reshape(-1, V)
    ref = F.log_softmax(frozen.model(input_ids=ids, attention_mask=att).logits, -1).reshape(-1, V)
    return F.kl_div(cur, ref, reduction="batchmean", log_target=True)


@pytest.mark.parametrize("chunk", [None, 7])
def test_kl_max_length_positions_equal_the_asu_authors_released_kl(pair, small_world, small_tok, chunk):
    """Every position of rows padded to max_length (prompt, padding and the last logit), with or without vocabulary
    chunks (7 rows at a time), against the released formula; the paper's answer-token term is another number."""
    from accelerate import Accelerator

    student, frozen = pair
    rows = small_world.splits["retain90"][:3]
    pad, width = pad_id(small_tok), 70
    side = _side(RETAIN, "kl", small_tok, rows, {"positions": "max_length"}, max_length=width)
    side.chunk = chunk
    with torch.no_grad():
        ours = side.loss(student, frozen, [0, 1, 2], Accelerator(cpu=True), pad)
        ids = torch.tensor([e.input_ids + [pad] * (width - len(e.input_ids)) for e in side.enc])
        att = torch.tensor([[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in side.enc])
        ref = asu_released_kl(student, frozen, ids, att)
        answer = _side(RETAIN, "kl", small_tok, rows, {}, max_length=width).loss(student, frozen, [0, 1, 2],
                                                                                 Accelerator(cpu=True), pad)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert abs(answer.item() - ref.item()) > 1e-4


def test_me_max_length_positions_equal_closer_looks_me_on_rows_padded_to_max_length(pair, small_world, small_tok):
    from accelerate import Accelerator

    student, _ = pair
    rows = small_world.splits["forget10"][:2]
    pad, width = pad_id(small_tok), 80
    side = _side(FORGET, "me", small_tok, rows, {"positions": "max_length"}, max_length=width)
    with torch.no_grad():
        ours = side.loss(student, None, [0, 1], Accelerator(cpu=True), pad)
        ids = [e.input_ids + [pad] * (width - len(e.input_ids)) for e in side.enc]
        att = [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in side.enc]
        logits = student(input_ids=torch.tensor(ids), attention_mask=torch.tensor(att)).logits[:, :-1]
        V = logits.shape[-1]
        soft = torch.softmax(logits, -1).reshape(-1, V)  # closer-look's get_me_loss with labels = the padded ids
        kl = F.kl_div((soft + 1e-12).log(), torch.full_like(soft, 1.0 / V), reduction="none").sum(-1)
        ref = kl.sum() / kl.numel()
        seq = _side(FORGET, "me", small_tok, rows, {"positions": "sequence"}, max_length=width).loss(
            student, None, [0, 1], Accelerator(cpu=True), pad)
    assert kl.numel() == 2 * (width - 1)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)
    assert abs(seq.item() - ref.item()) > 1e-4


def test_positions_other_than_answer_take_no_cache_and_are_checked(small_world, small_tok):
    from obliviate.errors import ConfigError
    from obliviate.modeling.cache import CacheBudget
    from obliviate.train.unlearn import add_caches

    rows = small_world.splits["retain90"][:3]
    batch_side = _side(RETAIN, "kl", small_tok, rows, {"positions": "batch"})
    answer_side = _side(RETAIN, "kl", small_tok, rows, {})
    add_caches(CacheBudget("exact", 1.0, 64, False), batch_side, answer_side)
    assert batch_side.caches == {} and set(answer_side.caches) == {"reference"}
    with pytest.raises(ConfigError, match=r"kl: positions must be one of \['answer', 'batch', 'max_length'\]"):
        RETAIN.get("kl").resolve({"positions": "sequence"})
    assert IGNORE_INDEX == -100
