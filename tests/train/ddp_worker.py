"""Run by tests/train/test_ddp.py under `torchrun --nproc_per_node 2` (and in-process with one process):
unlearn a tiny float64 model for a few steps with several gradient rules and save the parameters."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.data.synthetic import corpus_texts, make_world
from obliviate.modeling.tiny import tiny_llama, train_tokenizer
from obliviate.train.unlearn import unlearn

RULES = ("sum", "sago", "pcgrad")


def run(out: Path, per_device_batch: int) -> None:
    """Train one copy per rule from the same start; rank 0 writes parameters and the process count."""
    from accelerate import Accelerator

    torch.set_num_threads(1)
    world = make_world(10, seed=1, forget_percents=(10,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    acc = Accelerator(cpu=True)
    result = {"num_processes": acc.num_processes}
    for rule in RULES:
        model = tiny_llama(tok, hidden_size=32, num_layers=2, seed=0).double()
        method = MethodConfig(forget="asu", forget_args={"tau": 3.0, "layers": [0]}, retain="nll",
                              combine=CombineConfig(rule=rule))
        cfg = TrainConfig(max_steps=3, batch_size=per_device_batch, grad_accum=2, lr=1e-3, progress=False,
                          scheduler="constant", weight_decay=0.0,
                          share_prefix=False)  # as under torchrun, where it is off: the same path, exact
        res = unlearn(model, tok, world.splits["forget10"], world.splits["retain90"], method, cfg,
                      max_length=48, accelerator=acc)
        unwrapped = acc.unwrap_model(model) if hasattr(acc, "unwrap_model") else model
        result[rule] = {"params": [p.detach().reshape(-1).tolist() for p in unwrapped.parameters()],
                        "history": res.history}
    if acc.is_main_process:
        out.write_text(json.dumps(result))
    acc.wait_for_everyone()


def run_auto(out_dir: Path, per_device_batch: int) -> None:
    """As `obliviate unlearn` does without train.cpu: unlearn builds its own accelerator (make_accelerator),
    then only the main process writes. Each rank records what it saw in rank<RANK>.json; the main one
    creates result.json exclusively, so two processes that both think they are rank 0 fail."""
    import os

    from accelerate import PartialState

    torch.set_num_threads(1)
    world = make_world(10, seed=1, forget_percents=(10,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    model = tiny_llama(tok, hidden_size=32, num_layers=2, seed=0).double()
    cfg = TrainConfig(max_steps=3, batch_size=per_device_batch, grad_accum=2, lr=1e-3, progress=False,
                      scheduler="constant", weight_decay=0.0,
                          share_prefix=False)  # as under torchrun, where it is off: the same path, exact
    res = unlearn(model, tok, world.splits["forget10"], world.splits["retain90"],
                  MethodConfig(forget="ga", retain="nll"), cfg, max_length=48)
    state = PartialState()
    out_dir.mkdir(parents=True, exist_ok=True)
    info = {"num_processes": state.num_processes, "process_index": state.process_index,
            "is_main": state.is_main_process, "distributed_type": str(state.distributed_type)}
    (out_dir / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(info))
    if state.is_main_process:
        with open(out_dir / "result.json", "x") as f:
            json.dump({"params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
                       "history": res.history}, f)


if __name__ == "__main__":
    from obliviate.train.loop import end_process

    if sys.argv[3:] == ["auto"]:
        run_auto(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        run(Path(sys.argv[1]), int(sys.argv[2]))
    end_process(0)  # as the obliviate command leaves a torchrun launch
