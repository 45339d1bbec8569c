"""Run by tests/train/test_checkpoint.py as a subprocess that the test kills (SIGKILL or SIGINT) mid-run:
unlearn a tiny model with a checkpoint every step, printing `saved N` after each checkpoint."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import torch

from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.data.synthetic import corpus_texts, make_world
from obliviate.modeling.tiny import tiny_llama, train_tokenizer
from obliviate.train import checkpoint
from obliviate.train.unlearn import unlearn

STEPS = 8
METHOD = MethodConfig(forget="npo", retain="nll", combine=CombineConfig(rule="gru"))


def config(checkpoint_dir: str | None) -> TrainConfig:
    return TrainConfig(max_steps=STEPS, batch_size=2, grad_accum=2, lr=1e-3, progress=False, scheduler="linear",
                       weight_decay=0.01, checkpoint_dir=checkpoint_dir, checkpoint_every=1 if checkpoint_dir else 0)


def run(model, tok, world, checkpoint_dir: str | None):
    return unlearn(model, tok, world.splits["forget10"], world.splits["retain90"], METHOD, config(checkpoint_dir),
                   max_length=64)


def model_for(tok):
    return tiny_llama(tok, hidden_size=32, num_layers=1, seed=1)


def main(checkpoint_dir: str, done: Path) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, even when run in background
    torch.set_num_threads(1)
    world = make_world(10, seed=1, forget_percents=(10,))  # conftest's small_world and small_tok
    tok = train_tokenizer(corpus_texts(world), vocab_size=512)
    original = checkpoint.Checkpointer.save

    def save_and_report(self, step, *a, **k):
        original(self, step, *a, **k)
        print(f"saved {step}", flush=True)
        time.sleep(0.25)  # room for the test's signal to land anywhere in the next step or this pause

    checkpoint.Checkpointer.save = save_and_report
    run(model_for(tok), tok, world, checkpoint_dir)
    done.write_text("finished")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
