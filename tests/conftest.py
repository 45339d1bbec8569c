"""Shared test setup: one torch thread, the shared TOFU data, and a tiny world trained once per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

TOFU_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tofu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine two threads stall (30 s vs 0.3 s measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tofu_dir() -> Path:
    if not (TOFU_DIR / "forget01.jsonl").is_file():
        pytest.skip(f"TOFU data not found at {TOFU_DIR}")
    return TOFU_DIR


@pytest.fixture(scope="session")
def small_world():
    """A 10-author synthetic world (forget10 = 1 author)."""
    from obliviate.data.synthetic import make_world

    return make_world(10, seed=1, forget_percents=(10,))


@pytest.fixture(scope="session")
def small_tok(small_world):
    from obliviate.data.synthetic import corpus_texts
    from obliviate.modeling.tiny import train_tokenizer

    return train_tokenizer(corpus_texts(small_world), vocab_size=512)


@pytest.fixture(scope="session")
def trained_small(small_world, small_tok):
    """A hidden-48, 2-layer Llama fine-tuned a little on the small world's full split (a few seconds)."""
    from obliviate.config import TrainConfig
    from obliviate.modeling.tiny import tiny_llama
    from obliviate.train.unlearn import finetune

    model = tiny_llama(small_tok, hidden_size=48, num_layers=2, num_heads=4, seed=0)
    cfg = TrainConfig(max_steps=60, batch_size=16, lr=5e-3, progress=False, weight_decay=0.0)
    finetune(model, small_tok, small_world.splits["full"], cfg, max_length=64)
    return model.eval()
