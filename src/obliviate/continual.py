"""Continual unlearning (docs/METHODS.md §1.5): forget requests come in sequence, each from the last result as θ0;
after each request every forget set so far and a fixed retain sample are evaluated again."""
from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from obliviate.config import ContinualConfig, MethodConfig, TrainConfig
from obliviate.data.rows import QARow
from obliviate.errors import ConfigError
from obliviate.eval.generate import batched_avg_loss, generate_answers
from obliviate.eval.tofu import fact_recall, rouge_recall
from obliviate.modeling.frozen import has_adapters
from obliviate.train.tracking import trackers
from obliviate.train.unlearn import unlearn

TOFU_AUTHOR_ROWS = 20  # TOFU gives each author 20 consecutive QA rows
RETAIN_SAMPLE = 32  # the default evaluation's fixed retain sample: the first 32 retain rows

EvalFn = Callable[[torch.nn.Module, int, list[list[QARow]]], dict[str, Any]]


class ContinualError(ConfigError, ValueError):
    """An impossible continual setting: a ValueError that the CLI reports without a traceback."""


def author_groups(rows: Sequence[QARow]) -> list[list[QARow]]:
    """Rows by `row.author` in order of first appearance; without authors, TOFU blocks of 20 (docs/METHODS.md §1.5)."""
    if not rows:
        raise ContinualError("the forget set is empty: there is nothing to cut into requests")
    named = [getattr(r, "author", None) is not None for r in rows]
    if all(named):
        groups: dict[str, list[QARow]] = {}
        for r in rows:
            groups.setdefault(r.author, []).append(r)  # type: ignore[arg-type]
        return list(groups.values())
    if any(named):
        raise ContinualError(f"{named.count(False)} of {len(rows)} forget rows carry no `author` while the others "
                             "do; give every row an author, or none (then TOFU's 20 rows per author are assumed)")
    if len(rows) % TOFU_AUTHOR_ROWS:
        raise ContinualError(f"without `author` fields authors are TOFU's blocks of {TOFU_AUTHOR_ROWS} rows, but "
                             f"{len(rows)} rows is not a multiple of {TOFU_AUTHOR_ROWS}; give every row an author")
    return [list(rows[i:i + TOFU_AUTHOR_ROWS]) for i in range(0, len(rows), TOFU_AUTHOR_ROWS)]


def _authors_per_request(n_authors: int, n_requests: int | None, per: int | None) -> int:
    """How many authors each request takes; a ContinualError for counts that do not cut into equal requests."""
    for name, value in (("requests", n_requests), ("authors_per_request", per)):
        if value is not None and (type(value) is not int or value < 1):
            raise ContinualError(f"{name}={value!r} is impossible: it must be a whole number >= 1")
    if per is None and n_requests is None:
        return 1
    valid = [d for d in range(1, n_authors + 1) if n_authors % d == 0]
    if per is None:
        if n_authors % n_requests:  # type: ignore[operator]
            raise ContinualError(f"cannot cut {n_authors} forget author(s) into {n_requests} equal requests; "
                                 f"requests must be one of {valid}")
        return n_authors // n_requests  # type: ignore[operator]
    if n_authors % per:
        raise ContinualError(f"{n_authors} forget author(s) do not cut into requests of {per} authors; "
                             f"authors_per_request must be one of {valid}")
    if n_requests is not None and n_requests * per != n_authors:
        raise ContinualError(f"requests={n_requests} x authors_per_request={per} = {n_requests * per} authors, but "
                             f"the forget set has {n_authors}; set only one of the two")
    return per


def split_requests(rows: Sequence[QARow], n_requests: int | None = None, *,
                   authors_per_request: int | None = None) -> list[list[QARow]]:
    """Cut a forget set, in order, into equal requests of whole authors (docs/METHODS.md §1.5).

    Authors are `row.author` groups, or, when no row has one, blocks of 20 consecutive rows (TOFU's author
    size). With neither count given every author is one request."""
    groups = author_groups(rows)
    k = _authors_per_request(len(groups), n_requests, authors_per_request)
    return [[r for g in groups[i:i + k] for r in g] for i in range(0, len(groups), k)]


@dataclass
class ContinualResult:
    """Per-request training histories and seconds, and the evaluations (docs/METHODS.md §1.5).

    `steps[k]` = {"request": i (1-based, evaluated after request i), **eval_fn's dict}; the default adds "forget":
    [{"request": j, "rougeL_recall", "fact_recall"} for j = 1..i] and "retain": {"rougeL_recall", "nll"} | None."""

    n_requests: int = 0
    histories: list[list[dict[str, float]]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    total_seconds: float = 0.0


def _answers(model: Any, tokenizer: Any, rows: Sequence[QARow], cfg: ContinualConfig) -> list[str]:
    return generate_answers(model, tokenizer, [r.question for r in rows], max_new_tokens=cfg.max_new_tokens,
                            batch_size=cfg.batch_size)


def _forget_metrics(model: Any, tokenizer: Any, rows: Sequence[QARow], cfg: ContinualConfig) -> dict[str, Any]:
    """Greedy-answer ROUGE-L recall and fact recall of one request's rows (docs/METHODS.md §1.5)."""
    answers = _answers(model, tokenizer, rows, cfg)
    return {"rougeL_recall": float(np.mean(rouge_recall(answers, [r.answer for r in rows]))),
            "fact_recall": fact_recall(answers, rows)}


def _retain_metrics(model: Any, tokenizer: Any, rows: Sequence[QARow], cfg: ContinualConfig,
                    max_length: int) -> dict[str, float] | None:
    """ROUGE-L recall and mean answer NLL on the fixed retain sample (docs/METHODS.md §1.5)."""
    if not rows:
        return None
    answers = _answers(model, tokenizer, rows, cfg)
    nll = batched_avg_loss(model, tokenizer, [(r.question, r.answer) for r in rows], batch_size=cfg.batch_size,
                           max_length=max_length)
    return {"rougeL_recall": float(np.mean(rouge_recall(answers, [r.answer for r in rows]))),
            "nll": float(np.mean(nll))}


def default_eval(tokenizer: Any, retain_rows: Sequence[QARow], cfg: ContinualConfig, max_length: int = 256) -> EvalFn:
    """Forget metrics of every request seen so far plus retain-sample metrics (docs/METHODS.md §1.5)."""
    sample = list(retain_rows[:RETAIN_SAMPLE])

    def evaluate(model: torch.nn.Module, i: int, seen: list[list[QARow]]) -> dict[str, Any]:
        forget = [{"request": j + 1, **_forget_metrics(model, tokenizer, rows, cfg)} for j, rows in enumerate(seen)]
        return {"forget": forget, "retain": _retain_metrics(model, tokenizer, sample, cfg, max_length)}

    return evaluate


def _check_requests(requests: Sequence[Sequence[Any]], retain_rows: Sequence[Any], default: bool) -> None:
    """Clear errors for no requests, an empty request, or raw text under the default evaluation."""
    if not requests:
        raise ContinualError("no forget requests: give at least one (see split_requests)")
    empty = [i + 1 for i, rows in enumerate(requests) if not rows]
    if empty:
        raise ContinualError(f"forget request(s) {empty} are empty; every request needs rows to forget")
    rows = [r for req in requests for r in req] + list(retain_rows[:RETAIN_SAMPLE])
    if default and not all(isinstance(r, QARow) for r in rows):
        raise ContinualError("the default continual evaluation answers questions, so it needs QA rows; "
                             "pass eval_fn to evaluate raw-text requests")


def _request_train(train: TrainConfig, i: int) -> TrainConfig:
    """Request i's TrainConfig: its own checkpoint folder, so a resumed run never mixes requests."""
    if not train.checkpoint_dir:
        return train
    return dataclasses.replace(train, checkpoint_dir=str(Path(train.checkpoint_dir) / f"request_{i + 1:02d}"))


def rebase_adapters(model: torch.nn.Module) -> None:
    """LoRA: fold adapters into the base weights, restart them at zero: adapters-off = θ0 (docs/METHODS.md §1.5)."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for name in module.active_adapters:
            if module.use_dora.get(name):
                raise ContinualError("continual unlearning with LoRA needs plain LoRA adapters, not DoRA")
            base = module.get_base_layer().weight
            with torch.no_grad():
                base += module.get_delta_weight(name).to(base.dtype)
            module.reset_lora_parameters(name, init_lora_weights=True)


def _release(accelerator: Any) -> None:
    """Drop the finished request's optimizer and frozen θ0 before the next request copies the model."""
    if accelerator is not None:
        accelerator.free_memory()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _summary(step: dict[str, Any]) -> str:
    forget = " ".join(f"r{f['request']} {_num(f.get('rougeL_recall'))}" for f in step.get("forget", []))
    retain = step.get("retain") or {}
    return (f"continual: after request {step['request']}: forget ROUGE-L {forget or '-'} | retain ROUGE-L "
            f"{_num(retain.get('rougeL_recall'))} NLL {_num(retain.get('nll'))}")


def run_continual(model: torch.nn.Module, tokenizer: Any, requests: list[list[QARow]], retain_rows: Sequence[QARow],
                  method: MethodConfig, train: TrainConfig, *, eval_fn: EvalFn | None = None, max_length: int = 256,
                  log: Callable[[str], Any] = print, config: ContinualConfig | None = None,
                  accelerator: Any = None, tracking: Any = None) -> ContinualResult:
    """Unlearn the requests in order, each from the previous result as θ0 (docs/METHODS.md §1.5). With trackers
    (train.report_to; `tracking`: train/tracking.py), each request is a run of its own in a sub-directory."""

    cfg = config or ContinualConfig()
    _check_requests(requests, retain_rows, eval_fn is None)
    evaluate = eval_fn or default_eval(tokenizer, retain_rows, cfg, max_length)
    result, start, n = ContinualResult(n_requests=len(requests)), time.perf_counter(), len(requests)
    tracking = tracking if tracking is not None else trackers(train, name=method.label)
    for i, rows in enumerate(requests):
        log(f"continual: request {i + 1}/{n}: forgetting {len(rows)} rows; θ0 = "
            + (f"the model after request {i}" if i else "the starting model"))
        if i and has_adapters(model):  # LoRA's θ0 is adapters-off: it must be the model after request i
            rebase_adapters(model)
        res = unlearn(model, tokenizer, rows, retain_rows, method, _request_train(train, i),
                      max_length=max_length, accelerator=accelerator,
                      tracking=tracking.request(i + 1) if tracking is not None else None)
        _release(accelerator)
        result.histories.append(res.history)
        result.seconds.append(res.seconds)
        if (i + 1) % cfg.eval_every == 0 or i == n - 1:
            step = {"request": i + 1, **(evaluate(model, i, requests[: i + 1]) or {})}
            result.steps.append(step)
            log(_summary(step))
    result.total_seconds = time.perf_counter() - start
    return result


def _num(x: Any) -> str:
    return "–" if x is None else f"{float(x):.3f}"


def continual_table(result: ContinualResult) -> str:
    """Markdown: a row per evaluation; forget ROUGE-L of requests 1..n, retain ROUGE-L, NLL (docs/METHODS.md §1.5)."""
    n = max([result.n_requests] + [len(s.get("forget", [])) for s in result.steps])
    head = ["after request", *[f"forget ROUGE-L r{j}" for j in range(1, n + 1)], "retain ROUGE-L", "retain NLL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for step in result.steps:
        forget = {f.get("request"): f.get("rougeL_recall") for f in step.get("forget", [])}
        retain = step.get("retain") or {}
        cells = [str(step.get("request")), *[_num(forget.get(j)) for j in range(1, n + 1)],
                 _num(retain.get("rougeL_recall")), _num(retain.get("nll"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
