"""Run by tests/train/test_fsdp.py under `torchrun --nproc_per_node 2` with train.fsdp=true (and in-process with
one process): unlearn a tiny float64 model for 3 steps with each gradient rule and save the parameters. With two
processes, the rules in CHUNKED run with vocabulary chunks of 5 rows (student's and θ0 teacher's heads), the others
unchunked; one process runs every rule unchunked."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from obliviate.config import CombineConfig, MethodConfig, TrainConfig
from obliviate.data.synthetic import corpus_texts, make_world
from obliviate.modeling.tiny import tiny_llama, train_tokenizer
from obliviate.train.unlearn import unlearn

RULES = ("sum", "sago", "pcgrad", "pcgrad_global", "blur", "gru")
CHUNKED = ("sum", "pcgrad", "gru")  # sharded runs of these apply the LM head 5 answer rows at a time (train.vocab_chunk)


def run(out: Path, per_device_batch: int) -> None:
    """Train one copy per rule from the same start; rank 0 writes parameters, the process count and what
    the sharded run looked like (parameter types while training, the class after)."""
    from accelerate import Accelerator

    from obliviate.train import fsdp

    torch.set_num_threads(1)
    world = make_world(10, seed=1, forget_percents=(10,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    acc = Accelerator(cpu=True)
    result: dict = {"num_processes": acc.num_processes}
    if acc.num_processes > 1:
        result["reduced"] = fsdp.all_reduce_sums(torch.tensor([acc.process_index + 1.0, 2.0])).tolist()
    seen: list[str] = []
    from obliviate.train import optim

    original = optim.make_optimizer

    def spy(model, cfg, steps, warmup):  # the optimizer is built over the shards: record what it holds
        seen.append(type(next(model.parameters())).__name__)
        return original(model, cfg, steps, warmup)

    for rule in RULES:
        model = tiny_llama(tok, hidden_size=32, num_layers=2, seed=0).double()
        kw = {"cache": "none"} if "cache" in MethodConfig.__dataclass_fields__ else {}
        method = MethodConfig(forget="asu", forget_args={"tau": 3.0, "layers": [0]}, retain="nll",
                              combine=CombineConfig(rule=rule), **kw)
        chunk = 5 if acc.num_processes > 1 and rule in CHUNKED else 0
        cfg = TrainConfig(max_steps=3, batch_size=per_device_batch, grad_accum=2, lr=1e-3, progress=False,
                          scheduler="constant", weight_decay=0.0, fsdp=True, vocab_chunk=chunk,
                          share_prefix=False)  # as with two processes, where it is off: the same path, exact
        optim.make_optimizer = spy
        heads: dict[int, int] = {}  # id of each LM head (student's, θ0's) -> the most rows one call gave it

        def count(module, args, _out):
            if isinstance(module, torch.nn.Linear) and module.out_features == len(tok) and args[0].numel():
                rows = args[0].numel() // args[0].shape[-1]
                heads[id(module)] = max(heads.get(id(module), 0), rows)

        hook = torch.nn.modules.module.register_module_forward_hook(count)
        try:
            res = unlearn(model, tok, world.splits["forget10"], world.splits["retain90"], method, cfg,
                          max_length=48, accelerator=acc)
        finally:
            optim.make_optimizer = original
            hook.remove()
        result[rule] = {"params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
                        "history": res.history, "class": type(model).__name__,
                        "plain": all(type(p) is torch.nn.Parameter for p in model.parameters()),
                        "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
                        "head_rows": sorted(heads.values())}
    result["optimizer_params"] = seen
    # continual unlearning shards the same (gathered) model again: it must train and come back plain
    cfg = TrainConfig(max_steps=1, batch_size=per_device_batch, progress=False, fsdp=True)
    unlearn(model, tok, world.splits["forget10"], world.splits["retain90"], MethodConfig(forget="ga", retain="nll"),
            cfg, max_length=48, accelerator=acc)
    result["again_plain"] = all(type(p) is torch.nn.Parameter for p in model.parameters())
    if acc.is_main_process:
        out.write_text(json.dumps(result))
    acc.wait_for_everyone()


def run_resume(out: Path, per_device_batch: int, ckdir: str, stop_after: int) -> None:
    """ASU_KL + pcgrad with the θ0 cache (teacher and reference) and a checkpoint every step; stop after `stop_after` steps (0: run all 4)
    as Ctrl-C would, or finish and write the parameters (rank 0)."""
    from accelerate import Accelerator
    from helpers import interrupt_after

    torch.set_num_threads(1)
    world = make_world(10, seed=1, forget_percents=(10,))
    tok = train_tokenizer(corpus_texts(world), vocab_size=400)
    acc = Accelerator(cpu=True)
    model = tiny_llama(tok, hidden_size=32, num_layers=2, seed=0).double()
    method = MethodConfig(forget="asu", forget_args={"tau": 3.0, "layers": [0]}, retain="kl", cache="exact",
                          combine=CombineConfig(rule="pcgrad"))
    cfg = TrainConfig(max_steps=4, batch_size=per_device_batch, lr=1e-3, progress=False, scheduler="linear",
                      weight_decay=0.01, fsdp=True, checkpoint_dir=ckdir, checkpoint_every=1,
                      share_prefix=False)  # as with two processes, where it is off: the same path, exact

    def go():
        return unlearn(model, tok, world.splits["forget10"][:6], world.splits["retain90"][:12], method, cfg,
                       max_length=48, accelerator=acc)

    if stop_after:
        try:
            interrupt_after(stop_after, go)
        except KeyboardInterrupt:
            return
        raise AssertionError("the run was not interrupted")
    res = go()
    if acc.is_main_process:
        out.write_text(json.dumps({"num_processes": acc.num_processes, "steps": [h["step"] for h in res.history],
                                   "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}))
    acc.wait_for_everyone()


if __name__ == "__main__":
    from obliviate.train.loop import end_process

    if sys.argv[2] == "resume":
        run_resume(Path(sys.argv[1]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        run(Path(sys.argv[1]), int(sys.argv[2]))
    end_process(0)  # as the obliviate command leaves a torchrun launch, interrupted or not
