"""Unlearning and fine-tuning as compositions: encoded data + objective terms + the one loop."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.data.pairing import batches, paired_batches, shard
from obliviate.data.refusals import RefusalTwins, load_refusals
from obliviate.data.rows import Fields, QARow, check_disjoint, rows_from
from obliviate.data.text import chunk_texts, stream_windows
from obliviate.data.tokenize import Encoded, collate, encode_qa, pad_id
from obliviate.errors import ConfigError
from obliviate.gradients import RuleState
from obliviate.modeling.cache import CacheBudget, CachePool, RoleCache, TopK, complete_topk
from obliviate.modeling.frozen import FrozenModels, has_adapters
from obliviate.modeling.logprobs import (
    IGNORE_INDEX,
    decoder_layers,
    forward_stats,
    resolve_vocab_chunk,
)
from obliviate.modeling.positions import position_labels
from obliviate.objectives import ObjectiveSpec
from obliviate.train.fingerprint import fingerprint
from obliviate.train.fsdp import collective_device, place_frozen, prepare
from obliviate.train.loop import LossPlan, TrainResult, make_accelerator, run_loop
from obliviate.train.method import ResolvedMethod, cache_trajectory, resolve_method
from obliviate.train.optim import make_optimizer
from obliviate.train.schedule import schedule
from obliviate.train.tracking import trackers

if TYPE_CHECKING:
    from obliviate.modeling.frozen import FrozenModels


Rows = Sequence[QARow] | Sequence[str]


def as_rows(data: Any, fields: Fields | None = None, what: str = "rows") -> Rows:
    """What a run trains on: QARows and raw-text strings as given; records (a `datasets.Dataset`, a list of dicts)
    become QARows with their columns renamed by `fields` ({question: prompt, ...}); an empty list stays empty."""
    if isinstance(data, (list, tuple)) and (not data or all(isinstance(x, (QARow, str)) for x in data)):
        if fields and data:
            raise ConfigError(f"{what}: fields rename the columns of records (dicts or a datasets.Dataset); these "
                              "are already QA rows or texts")
        return data
    return rows_from(data, fields, what)


def is_text(rows: Rows) -> bool:
    """Raw-text documents (MUSE-style corpora) rather than QA rows."""
    return bool(rows) and isinstance(rows[0], str)


def encode_rows(tokenizer: Any, rows: Rows, max_length: int, windows: str = "document") -> list[Encoded]:
    """QA rows with the prompt masked, or raw documents cut into max_length windows (every token a label): per
    document, or with windows="stream" as open-unlearning cuts them (data/text.py)."""
    if is_text(rows):
        cut = stream_windows if windows == "stream" else chunk_texts
        return cut(tokenizer, list(rows), max_length)  # type: ignore[arg-type]
    return [encode_qa(tokenizer, r.question, r.answer, max_length) for r in rows]  # type: ignore[union-attr]


StepShare = tuple[list[int], int]  # one side's indices over a whole optimizer step, its number of micro-batches


def _count(e: Encoded, kind: str) -> int:
    """Tokens of one example a reduction counts: "targets" (shifted labels), "sequence", "labels" (unshifted)."""
    if kind == "sequence":
        return len(e.input_ids) - 1
    labels = e.labels[1:] if kind == "targets" else e.labels
    return sum(1 for t in labels if t != IGNORE_INDEX)


def _pool_total(enc: list[Encoded], step: StepShare | None, kind: str, scale: float, world: int) -> float | None:
    """N for "token" pooling on one rank's micro-batch, so that its loss × `scale`, summed over the
    step's micro-batches and averaged over ranks, is Σ over the step's tokens / their number.

    With N_step tokens in the whole step, G micro-batches and P ranks: N = N_step·scale/(P·G).
    None (no step known, e.g. a direct call) pools over the micro-batch itself."""
    if step is None:
        return None
    idx, micro_batches = step
    n = max(sum(_count(enc[i], kind) for i in idx), 1)
    return n * scale / (world * micro_batches)


@dataclass
class Side:
    """One data side of a step (forget or retain): encodings, optional refusal twins, its loss."""

    spec: ObjectiveSpec
    kwargs: dict[str, Any]
    weight: float
    enc: list[Encoded]
    refusal_enc: RefusalTwins | None = None
    loop_kw: dict[str, Any] = field(default_factory=dict)
    max_length: int = 0  # rows are padded to it when positions = "max_length"
    caches: dict[str, RoleCache] = field(default_factory=dict)  # θ0 stats per example (modeling/cache.py)
    chunk: int | None = None  # rows per vocabulary chunk (train.vocab_chunk resolved; None: unchunked)
    share_prefix: bool = True  # train.share_prefix: a batch's shared leading tokens run once (modeling/prefix.py)

    def _frozen(self, role: str, batch: dict, mine: list[int], model: torch.nn.Module, live: Any) -> Any:
        """θ0 stats of `role` on `batch` (rows: examples `mine`): from the cache when it has one, else live.

        Under FSDP a θ0 forward is collective, so the ranks agree first (one all-reduce of a flag): if any
        rank misses an example, every rank runs the live forward (and caches what it lacked)."""
        cache = self.caches.get(role)
        if cache is None:
            return live()
        force = _sharded(model) and _any_rank(any(i not in cache.store for i in mine))
        return cache.get(batch, mine, model, live, force_live=force)

    def loss(self, model: torch.nn.Module, frozen: FrozenModels | None, idx: list[int], acc: Any, pad: int,
             step: StepShare | None = None, step_number: int = 0) -> torch.Tensor:
        """The side's loss on this rank's shard of the global micro-batch `idx`, scaled to a global mean.

        Example means are made global by `_shard_batch`'s factor; "token" pooling divides by the
        answer-token count of the whole optimizer step `step` (every rank and micro-batch), so
        1 process × batch 8 and 2 × 4, or 8 × 1 accumulated 8 ×, give the same loss.
        """
        batch, scale = _shard_batch(self.enc, idx, acc, pad)
        positions = self.loop_kw.get("positions", "answer")
        kind = {"answer": "targets", "sequence": "sequence"}.get(positions)  # None: a mean per micro-batch
        if positions != "answer":
            batch = position_labels(batch, positions, pad=pad, vocab_size=_vocab_size(model), max_length=self.max_length,
                                    last=self.spec.last_position)
        needs, extra = self.spec.needs, {}
        layer = self.kwargs.get("layer") if "hidden" in needs else None
        world = acc.num_processes
        total = _pool_total(self.enc, step, kind, scale, world) if kind else None
        mine = shard(idx, acc.process_index, world)
        if "teacher" in needs:
            extra["teacher"] = self._frozen("teacher", batch, mine, model,
                                            lambda: frozen.teacher_stats(batch))  # type: ignore[union-attr]
        if "reference" in needs:
            extra["reference"] = self._frozen("reference", batch, mine, model, lambda: frozen.reference_stats(
                batch, hidden_layer=layer))  # type: ignore[union-attr]
        if self.refusal_enc is not None and ("refusal" in needs or "refusal_reference" in needs):
            twins = self.refusal_enc.at(step_number)  # this optimizer step's refusals (method.refusal_draw)
            rbatch, _ = _shard_batch(twins, idx, acc, pad)  # type: ignore[arg-type]
            rtotal = _pool_total(twins, step, "targets", scale, world)  # type: ignore[arg-type]
            if "refusal" in needs:
                extra["refusal"] = forward_stats(model, rbatch, chunk=self.chunk, share_prefix=self.share_prefix)
                extra["refusal"].token_total = rtotal
            if "refusal_reference" in needs:
                extra["refusal_reference"] = self._frozen("refusal_reference", rbatch, mine, model,
                                                          lambda: frozen.reference_stats(rbatch))  # type: ignore[union-attr]
        policy = forward_stats(model, batch, keep_logits=layer is None, hidden_layer=layer, chunk=self.chunk,
                               share_prefix=self.share_prefix)
        policy.token_total = total
        if layer is not None:
            policy.hidden_total = _pool_total(self.enc, step, "labels", scale, world)
        extra = {k: complete_topk(v, policy.answer_log_probs()) if isinstance(v, TopK) else v for k, v in extra.items()}
        return self.spec.fn(policy, **extra, **self.kwargs) * scale


def _now(fp: Any, train: TrainConfig) -> Any:
    """The fingerprint taken now (the model is still θ0 and whole) when checkpoints will record it, else None."""
    if not train.checkpoint_dir:
        return None
    value = fp()
    return lambda: value


def _sharded(model: torch.nn.Module) -> bool:
    """FSDP-sharded training: a frozen forward is collective (every rank must run it together)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _any_rank(flag: bool) -> bool:
    """Whether `flag` holds on some rank (one all-reduce of a float on the process group's device)."""
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def by_length(group: list[list[int]], length: Sequence[int]) -> list[list[int]]:
    """One optimizer step's micro-batches re-cut after sorting its examples by length (stable), same sizes.

    The step's examples, and so its gradient (example means and token pooling span the whole step), are
    unchanged; each accumulation micro-batch then pads to a length close to its rows' own."""
    order = sorted((i for m in group for i in m), key=lambda i: length[i])
    out, at = [], 0
    for m in group:
        out.append(order[at: at + len(m)])
        at += len(m)
    return out


def with_steps(plan: Iterator[tuple[list[int], list[int]]], grad_accum: int,
               lengths: tuple[Sequence[int], Sequence[int]] | None = None
               ) -> Iterator[tuple[list[int], list[int], tuple[StepShare, StepShare], int]]:
    """Each (forget, retain) micro-batch with both sides' indices over its whole optimizer step and the step's number
    (0, 1, ...); with `lengths` (per side, per example) and accumulation, each side's micro-batches are grouped by
    length (`by_length`)."""
    number = 0
    while True:
        group = [next(plan) for _ in range(grad_accum)]
        fs, rs = [m[0] for m in group], [m[1] for m in group]
        if lengths is not None and grad_accum > 1:
            fs = by_length(fs, lengths[0])
            rs = by_length(rs, lengths[1]) if any(rs) else rs
        f, r = [i for m in fs for i in m], [i for m in rs for i in m]
        for mf, mr in zip(fs, rs):
            yield mf, mr, ((f, grad_accum), (r, grad_accum)), number
        number += 1


def grouped(plan: Iterator[list[int]], grad_accum: int, length: Sequence[int] | None) -> Iterator[list[int]]:
    """Single-side batches (fine-tuning) grouped by length within each optimizer step, as `with_steps`."""
    while True:
        group = [next(plan) for _ in range(grad_accum)]
        yield from (by_length(group, length) if length is not None and grad_accum > 1 else group)


def _sides(rm: ResolvedMethod, method: MethodConfig, tokenizer: Any, forget_rows: Rows,
           retain_rows: Rows, max_length: int, seed: int, chunk: int | None = None,
           windows: str = "document", share_prefix: bool = True) -> tuple[Side, Side | None]:
    """Encode both sides, with refusal answers for the questions when an objective needs them (θ0 caches:
    `attach_caches`)."""
    if rm.needs_refusals and (is_text(forget_rows) or is_text(retain_rows)):
        raise ConfigError(f"{method.forget}/{method.retain} answer questions with a refusal, but the data is raw "
                          "text; use a QA split or an objective without refusals (e.g. npo, ga, rmu, asu)")
    refusals = load_refusals(method.refusals) if rm.needs_refusals else None

    def refusal_twins(rows: Sequence[QARow], stream: int) -> RefusalTwins:
        return RefusalTwins(lambda q, a: encode_qa(tokenizer, q, a, max_length), [r.question for r in rows],
                            refusals, seed * 7 + stream, method.refusal_draw)  # type: ignore[arg-type]

    forget = Side(rm.forget, rm.forget_kw, rm.gamma, encode_rows(tokenizer, forget_rows, max_length, windows),
                  refusal_twins(forget_rows, 0) if refusals else None, dict(rm.loop_kw), max_length, chunk=chunk,
                  share_prefix=share_prefix)
    if rm.retain is None:
        return forget, None
    retain = Side(rm.retain, rm.retain_kw, rm.alpha, encode_rows(tokenizer, retain_rows, max_length, windows),
                  refusal_twins(retain_rows, 1) if refusals else None, dict(rm.retain_loop_kw), max_length, chunk=chunk,
                  share_prefix=share_prefix)
    return forget, retain


def planned_rows(n_forget: int, n_retain: int, global_batch: int, seed: int, batches: int) -> tuple[set[int], set[int]]:
    """(forget, retain) example indices the first `batches` global micro-batches of the run's plan hold: the rows
    whose θ0 statistics a cache will ever store."""
    plan = paired_batches(n_forget, n_retain, global_batch, seed=seed)
    forget: set[int] = set()
    retain: set[int] = set()
    for _ in range(batches):
        f, r = next(plan)
        forget.update(f)
        retain.update(r)
        if len(forget) == n_forget and len(retain) == n_retain:
            break
    return forget, retain


def attach_caches(method: MethodConfig, rm: ResolvedMethod, forget: Side, retain: Side | None, pool: dict | None,
                  chunk: int | None, used: tuple[set[int], set[int]] | None = None) -> CacheBudget:
    """The run's θ0 caches (method.cache*), sized by the rows the run will use (`used`, else every row)."""
    budget = CacheBudget(method.cache, method.cache_max_gb, method.cache_topk, method.cache_bf16,
                         chunked=chunk is not None, spill=method.cache_spill, directory=method.cache_dir)
    add_caches(budget, forget, retain, pool=pool, teacher=json.dumps(rm.teacher_kw, sort_keys=True, default=str),
               used=used)
    return budget


def add_caches(budget: CacheBudget, *sides: Side | None, pool: dict | None = None, teacher: str = "",
               used: Sequence[set[int]] | None = None) -> None:
    """A θ0 cache for each frozen role the sides' objectives read (hidden states stay live), its estimate over the
    examples in `used` (per side; default: all). With `pool`, a cache is taken from (or left in) it under a key of
    everything its entries depend on: the side, the role, the objective, the teacher's settings, the cache's mode
    and form, and the encoded rows themselves (θ0 is the caller's: one pool per θ0)."""
    for n, side in enumerate(sides):
        if side is None:
            continue
        rows = sorted(used[n]) if used is not None else None
        needs = side.spec.needs
        if side.loop_kw.get("positions", "answer") != "answer":
            continue  # stats at padding positions depend on the batch's width: no per-example cache
        roles = [r for r in ("teacher", "reference") if r in needs and not (r == "reference" and "hidden" in needs)]
        if "refusal_reference" in needs and side.refusal_enc is not None and side.refusal_enc.draw == "per_example":
            roles.append("refusal_reference")
        for role in roles:
            enc = side.refusal_enc.fingerprint_rows() if role == "refusal_reference" else side.enc
            key = (n, role, side.spec.name, teacher if role == "teacher" else "", budget.mode, budget.topk,
                   budget.bf16, budget.chunked, hash(tuple(tuple(e.input_ids) for e in enc)))  # type: ignore[union-attr]
            kept = pool.take(key) if isinstance(pool, CachePool) else (pool or {}).get(key)
            if kept is not None:
                side.caches[role] = kept
                continue
            counted = enc if rows is None else [enc[i] for i in rows]  # type: ignore[index]
            cache = budget.role(side.spec.name, role, sum(_count(e, "targets") for e in counted),
                                side.spec.frozen_use)
            if cache is not None:
                side.caches[role] = cache
                if pool is not None:
                    pool[key] = cache


WMDP_PARAM = "mlp.down_proj.weight"  # WMDP's param_ids [6] of a Llama/Mistral decoder layer


def select_trainable(model: torch.nn.Module, params: str | Sequence[str], layers: list[int] | None,
                     anchor: int | None) -> list[str]:
    """Freeze every parameter except RMU's trainable ones; return their names (sorted).

    params "wmdp": mlp.down_proj.weight of decoder `layers` (WMDP's rmu/unlearn.py: param_ids [6] of
    layers 5, 6, 7; open-unlearning's RMU.yaml: the same regex); "layers": every parameter of those
    layers; a list of regexes: the parameters whose full name one of them matches (re.fullmatch, as
    open-unlearning), `layers` then unset. Default layers: anchor−2..anchor (the RMU layer and two below).
    """
    names = {id(p): n for n, p in model.named_parameters()}
    if isinstance(params, str):
        if params not in ("wmdp", "layers"):
            raise ConfigError(f"trainable_params must be 'wmdp', 'layers' or a list of parameter-name regexes, got {params!r}")
        stack = decoder_layers(model)
        chosen = list(layers) if layers is not None else [i for i in range((anchor or 0) - 2, (anchor or 0) + 1) if i >= 0]
        bad = [i for i in chosen if not 0 <= i < len(stack)]
        if bad or not chosen:
            raise ConfigError(f"trainable_layers {chosen} must be indices of the {len(stack)} decoder layers (0..{len(stack) - 1})")
        picked = [p for i in chosen for n, p in stack[i].named_parameters() if params == "layers" or n == WMDP_PARAM]
        if params == "wmdp" and len(picked) != len(chosen):
            raise ConfigError(f"trainable_params 'wmdp' trains {WMDP_PARAM} of each chosen layer, which this model's "
                              "layers lack; pass trainable_params as a list of parameter-name regexes")
    else:
        if layers is not None:
            raise ConfigError("trainable_layers applies to trainable_params 'wmdp' or 'layers'; a list of regexes names "
                              "the parameters itself (drop trainable_layers)")
        try:
            patterns = [re.compile(str(x)) for x in params]
        except re.error as err:
            raise ConfigError(f"trainable_params: invalid regex ({err})") from None
        picked = [p for p in model.parameters() if any(r.fullmatch(names[id(p)]) for r in patterns)]
        if not picked:
            raise ConfigError(f"trainable_params {list(params)} match no parameter name (e.g. {next(iter(names.values()))!r})")
    for p in model.parameters():
        p.requires_grad_(False)
    for p in picked:
        p.requires_grad_(True)
    return sorted(names[id(p)] for p in picked)


def _vocab_size(model: torch.nn.Module) -> int:
    """The output vocabulary size V of a (DDP-, PEFT- or FSDP-wrapped) causal LM: its config's vocab_size."""
    inner = getattr(model, "module", model)
    inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    return int(inner.config.vocab_size)


def vocab_chunk(train: TrainConfig, model: torch.nn.Module) -> int | None:
    """Rows per vocabulary chunk of a run (train.vocab_chunk at the model's vocabulary; None: unchunked). Under
    train.fsdp too: the root's parameters (embeddings, head) stay gathered from its forward to its backward
    (train/fsdp.py `shard`), so the chunks apply the head after the forward and in the backward's recompute."""
    return resolve_vocab_chunk(train.vocab_chunk, _vocab_size(model))


def _shard_batch(enc: list[Encoded], idx: list[int], acc: Any, pad: int) -> tuple[dict, float]:
    """This rank's collated share of a global micro-batch and the factor making rank means global."""
    mine = shard(idx, acc.process_index, acc.num_processes)
    batch = {k: v.to(acc.device) for k, v in collate([enc[i] for i in mine], pad).items()}
    return batch, len(mine) * acc.num_processes / len(idx)


def unlearn(model: torch.nn.Module, tokenizer: Any, forget_rows: Rows, retain_rows: Rows,
            method: MethodConfig, train: TrainConfig, *, max_length: int = 256, accelerator: Any = None,
            monitor: Any = None, cache_pool: dict | None = None, fields: Fields | None = None,
            tracking: Any = None, windows: str = "document") -> TrainResult:
    """Minimise γ·L_F(forget) + α·L_R(retain) from the current weights (θ0) for the configured steps.

    Rows: lists of QARow or raw-text strings, or records (a `datasets.Dataset`, a list of dicts) whose columns
    `fields` maps to obliviate's ({"question": "prompt", "answer": "response"}).

    Rows are QA pairs (prompt masked) or raw-text documents (cut into windows per document, or as one stream
    with windows="stream": data.windows; every token counted). `monitor`
    (train/monitor.py) evaluates during training; `cache_pool` keeps the θ0 caches for the next call on the
    same rows and θ0 (a sweep's trials: the teacher's and reference's statistics are computed once). `tracking`
    (train/tracking.py): where and under which name train.report_to's trackers record the run (default: in
    train.tracking_dir or ./logs, named by the method).
    """

    forget_rows, retain_rows = as_rows(forget_rows, fields, "forget rows"), as_rows(retain_rows, fields, "retain rows")
    rm = resolve_method(method)
    if rm.retain is not None and not (is_text(forget_rows) or is_text(retain_rows)):
        check_disjoint(forget_rows, retain_rows)  # type: ignore[arg-type]
    tracking = tracking if tracking is not None else trackers(train, name=method.label)
    acc = accelerator or make_accelerator(train, tracking)
    chunk = vocab_chunk(train, model)
    fside, rside = _sides(rm, method, tokenizer, forget_rows, retain_rows, max_length, train.seed, chunk, windows,
                          train.share_prefix)
    if "trainable_params" in rm.loop_kw and has_adapters(model):
        raise ConfigError("RMU chooses its trainable parameters itself; run it without LoRA (model.lora.enabled=false)")
    if "trainable_params" in rm.loop_kw:
        select_trainable(model, rm.loop_kw["trainable_params"], rm.loop_kw["trainable_layers"], rm.forget_kw.get("layer"))
    frozen = FrozenModels(model, rm.teacher, chunk=chunk, share_prefix=train.share_prefix) if rm.needs_frozen else None
    if frozen is not None:
        place_frozen(frozen, acc, train, method)
    global_batch = train.batch_size * acc.num_processes
    sch = schedule(len(fside.enc), global_batch, train)
    steps = sch.steps
    used = planned_rows(len(fside.enc), len(rside.enc) if rside else 0, global_batch, train.seed,
                        steps * train.grad_accum)
    attach_caches(method, rm, fside, rside, cache_pool, chunk, used)
    opt, sched = make_optimizer(model, train, steps, sch.warmup)
    data = {"forget": fside.enc, "retain": rside.enc if rside else [],
            "forget_refusals": fside.refusal_enc.fingerprint_rows() if fside.refusal_enc else [],
            "retain_refusals": rside.refusal_enc.fingerprint_rows() if rside and rside.refusal_enc else []}
    fp = partial(fingerprint, "unlearn", train, steps=steps, global_batch=global_batch, max_length=max_length,
                 model=model, tokenizer=tokenizer, data=data,
                 method={**rm.settings(), "cache": cache_trajectory(method),
                         **({"refusal_draw": method.refusal_draw} if rm.needs_refusals else {})})
    fp = _now(fp, train)  # θ0's weights, read before prepare shards them
    model, opt, sched = prepare(acc, model, opt, sched, train, sch)
    pad = pad_id(tokenizer)
    lengths = ([len(e.input_ids) for e in fside.enc], [len(e.input_ids) for e in rside.enc] if rside else [])
    plan = with_steps(paired_batches(len(fside.enc), len(rside.enc) if rside else 0, global_batch, seed=train.seed),
                      train.grad_accum, lengths if train.group_by_length else None)

    def compute(micro: tuple[list[int], list[int], tuple[StepShare, StepShare]], part: str) -> tuple[float, torch.Tensor]:
        side, idx, step = (fside, micro[0], micro[2][0]) if part == "forget" else (rside, micro[1], micro[2][1])
        return side.weight, side.loss(model, frozen, idx, acc, pad, step, micro[3])  # type: ignore[union-attr]

    loss_plan = LossPlan(parts=("forget", "retain") if rm.retain else ("forget",), compute=compute, rule=rm.rule,
                         separate=rm.separate, alpha=rm.alpha, gamma=rm.gamma, module_stats=rm.module_stats,
                         rule_state=RuleState() if rm.separate else None, rule_params=rm.rule_params)
    name = f"unlearn {method.forget}" + (f"+{rm.rule.name}" if rm.rule.separate else "")
    if monitor is not None and _sharded(model):
        raise ConfigError("evaluation during training (eval.every_steps) is not supported with FSDP: the sharded "
                          "model cannot generate on one rank; drop eval.every_steps or train without fsdp")
    return run_loop(model, plan, loss_plan, train, steps, acc, opt, sched, desc=name, fingerprint=fp, monitor=monitor,
                    tracking=tracking)


def finetune_fingerprint(model: torch.nn.Module, tokenizer: Any, rows: Rows, train: TrainConfig, *,
                         max_length: int = 256, processes: int = 1) -> dict[str, Any]:
    """What decides a fine-tune's weights (train/fingerprint.py), taken before its first step: its checkpoints record
    it, and `obliviate finetune` keeps it beside the model to reuse a finished run with the same one."""
    enc = encode_rows(tokenizer, rows, max_length)
    global_batch = train.batch_size * processes
    return fingerprint("finetune", train, steps=schedule(len(enc), global_batch, train).steps, global_batch=global_batch,
                       max_length=max_length, model=model, tokenizer=tokenizer, data={"rows": enc})


def finetune(model: torch.nn.Module, tokenizer: Any, rows: Rows, train: TrainConfig, *,
             max_length: int = 256, accelerator: Any = None, desc: str = "finetune",
             fields: Fields | None = None, tracking: Any = None, monitor: Any = None) -> TrainResult:
    """Supervised fine-tuning: minimise answer-token NLL on QA rows or raw documents (or records, see `unlearn`).

    The NLL is averaged per example, then over examples (not Hugging Face Trainer's token pooling):
    the built-in targets and retain models, and the tables measured on them, were trained this way.
    `monitor` (train/monitor.py) evaluates between steps, e.g. what the model knows yet (eval/known.py).
    """

    rows = as_rows(rows, fields)
    tracking = tracking if tracking is not None else trackers(train, name=desc)
    acc = accelerator or make_accelerator(train, tracking)
    enc = encode_rows(tokenizer, rows, max_length)
    global_batch = train.batch_size * acc.num_processes
    sch = schedule(len(enc), global_batch, train)
    steps = sch.steps
    opt, sched = make_optimizer(model, train, steps, sch.warmup)
    fp = partial(finetune_fingerprint, model, tokenizer, rows, train, max_length=max_length, processes=acc.num_processes)
    chunk = vocab_chunk(train, model)
    fp = _now(fp, train)
    model, opt, sched = prepare(acc, model, opt, sched, train, sch)
    pad = pad_id(tokenizer)

    def compute(idx: list[int], part: str) -> tuple[float, torch.Tensor]:
        b, s = _shard_batch(enc, idx, acc, pad)
        return 1.0, forward_stats(model, b, keep_logits=False, chunk=chunk, share_prefix=train.share_prefix).nll.mean() * s

    plan = LossPlan(parts=("nll",), compute=compute)
    lengths = [len(e.input_ids) for e in enc] if train.group_by_length else None
    return run_loop(model, grouped(batches(len(enc), global_batch, seed=train.seed), train.grad_accum, lengths), plan,
                    train, steps, acc, opt, sched, desc=desc, fingerprint=fp, tracking=tracking, monitor=monitor)
