"""Analyses the seed papers rest on: factual vs functional answer tokens, attention entropy, τ calibration.

Token classes (transparent on purpose):
  * rows with annotations (the synthetic world): a token is FACTUAL when its characters overlap an
    annotated fact or name span of the answer, FUNCTIONAL otherwise;
  * rows without (real data): the same rule on heuristic spans: numbers, words inside quotes, and
    capitalised words that do not start a sentence (plus "I"-free stopword check).
  EOS, whitespace-only tokens and tokens whose offsets cannot be mapped are left out of both classes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from obliviate.data.rows import QARow
from obliviate.data.tokenize import collate, encode_qa, has_chat_template, pad_id
from obliviate.errors import ConfigError
from obliviate.eval.fluency import is_degenerate
from obliviate.eval.generate import generate_answers
from obliviate.eval.tofu import fact_recall, rouge_recall
from obliviate.modeling import chat
from obliviate.modeling.logprobs import forward_stats
from obliviate.modeling.smoothing import attention_entropy, smoothed_teacher
from obliviate.progress import track

FACTUAL, FUNCTIONAL, OTHER = 1, 0, -1
_QUOTED = re.compile(r"'[^']+'|\"[^\"]+\"")
_NUMBER = re.compile(r"\d[\d,./-]*")
_CAPITALISED = re.compile(r"\b[A-Z][\w'-]*")


def heuristic_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of likely facts in unannotated text: numbers, quoted titles, mid-sentence capitals."""
    spans = [m.span() for m in _QUOTED.finditer(text)] + [m.span() for m in _NUMBER.finditer(text)]
    for m in _CAPITALISED.finditer(text):
        before = text[: m.start()].rstrip()
        if before and before[-1] not in ".!?:" and m.group() != "I":
            spans.append(m.span())
    return sorted(spans)


def fact_spans(row: QARow) -> list[tuple[int, int]]:
    """Annotated fact + name spans of the answer, or heuristic ones when the row has none."""
    annotated = list(row.fact_spans) + list(row.name_spans)
    return sorted(annotated) if annotated else heuristic_spans(row.answer)


def answer_token_classes(tokenizer: Any, row: QARow, n_answer_tokens: int) -> np.ndarray:
    """FACTUAL / FUNCTIONAL / OTHER for each of the example's counted answer tokens. -> [n]."""
    # as encode_qa: chat answers start the turn, raw-template ones follow the prompt, plain ones come after a space
    lead = "" if has_chat_template(tokenizer) or chat.raw_template(tokenizer) is not None else " "
    enc = tokenizer(lead + row.answer, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [(max(0, s - len(lead)), max(0, e - len(lead))) for s, e in enc["offset_mapping"]]
    spans = fact_spans(row)
    out = np.full(n_answer_tokens, OTHER, dtype=np.int64)
    for i, (s, e) in enumerate(offsets[:n_answer_tokens]):
        if row.answer[s:e].strip():  # whitespace-only tokens belong to neither class
            out[i] = FACTUAL if any(s < fe and fs < e for fs, fe in spans) else FUNCTIONAL
    return out


@torch.no_grad()
def token_logprobs(model: Any, tokenizer: Any, rows: Sequence[QARow], *, batch_size: int = 32,
                   max_length: int = 256) -> list[np.ndarray]:
    """Per example, the log-probs [n_i] of its answer tokens (teacher forced), in answer order."""
    out: list[np.ndarray] = []
    device = next(model.parameters()).device
    for i in range(0, len(rows), batch_size):
        enc = [encode_qa(tokenizer, r.question, r.answer, max_length) for r in rows[i: i + batch_size]]
        batch = {k: v.to(device) for k, v in collate(enc, pad_id(tokenizer)).items()}
        stats = forward_stats(model, batch, keep_logits=False)
        for lp, m in zip(stats.token_logp.cpu(), stats.mask.cpu()):
            out.append(lp[m].double().numpy())
    return out


@dataclass(frozen=True)
class ClassShift:
    """Mean per-token log-prob change (after − before) of factual and functional answer tokens."""

    factual: float
    functional: float
    n_factual: int
    n_functional: int

    @property
    def selectivity(self) -> float:
        """How much more factual tokens lose than functional ones (nats; larger = more selective)."""
        return self.functional - self.factual


def class_shift(before: Sequence[np.ndarray], after: Sequence[np.ndarray], classes: Sequence[np.ndarray]) -> ClassShift:
    """Aggregate per-token log-prob changes by class. Each argument: per example, arrays [n_i]."""
    delta = np.concatenate([a - b for a, b in zip(after, before)]) if before else np.zeros(0)
    cls = np.concatenate(list(classes)) if classes else np.zeros(0, dtype=np.int64)
    if delta.shape != cls.shape:
        raise ValueError(f"{delta.shape[0]} token changes but {cls.shape[0]} token classes")
    fact, func = delta[cls == FACTUAL], delta[cls == FUNCTIONAL]
    mean = lambda x: float(x.mean()) if x.size else float("nan")  # noqa: E731
    return ClassShift(mean(fact), mean(func), int(fact.size), int(func.size))


def classes_for(tokenizer: Any, rows: Sequence[QARow], logps: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Token classes aligned with `token_logprobs` output (the EOS / truncated tail becomes OTHER)."""
    return [answer_token_classes(tokenizer, r, len(lp)) for r, lp in zip(rows, logps)]


def compare_models(before: Any, after: Any, tokenizer: Any, rows: Sequence[QARow], **kw: Any) -> ClassShift:
    """ClassShift of `after` (an unlearned model or a smoothed teacher) against `before` on `rows`."""
    lp0 = token_logprobs(before, tokenizer, rows, **kw)
    lp1 = token_logprobs(after, tokenizer, rows, **kw)
    return class_shift(lp0, lp1, classes_for(tokenizer, rows, lp0))


def entropy_by_layer(model: Any, tokenizer: Any, rows: Sequence[QARow], *, per_head: bool = False,
                     max_length: int = 256) -> list:
    """Mean attention entropy (nats) per layer (or [layer][head]) on the rows' prompt + answer."""
    enc = [encode_qa(tokenizer, r.question, r.answer, max_length) for r in rows]
    return attention_entropy(model, collate(enc, pad_id(tokenizer)), per_head=per_head).tolist()


def default_layer_sets(n_layers: int) -> list[list[int] | None]:
    """Candidate layer sets: the first layer, the first two, the first quarter, the paper's shallow-middle
    band (layers 6-8 of 32, scaled), and every layer (None)."""
    quarter = max(1, n_layers // 4)
    lo, hi = round(6 * n_layers / 32), round(8 * n_layers / 32)
    sets = [[0], list(range(min(2, n_layers))), list(range(quarter)), list(range(lo, max(hi, lo) + 1))]
    unique = []
    for s in sets:
        s = [i for i in s if 0 <= i < n_layers]
        if s and s not in unique and len(s) < n_layers:
            unique.append(s)
    return unique + [None]


def layer_windows(n_layers: int, widths: Sequence[int], starts: int) -> list[list[int]]:
    """Contiguous windows [s, s + w) for each width w, at `starts` start layers spread evenly from 0 to n − w
    (fewer when that range has fewer), shallow first: the teacher map's layer axis (across the depth, not only
    prefixes). A width outside 1..n_layers is a ConfigError."""

    bad = [w for w in widths if not isinstance(w, int) or isinstance(w, bool) or not 1 <= w <= n_layers]
    if bad or not widths or starts < 1:
        raise ConfigError(f"window_widths {list(widths)} with window_starts {starts}: the model has {n_layers} layers, "
                          f"so each width must be 1..{n_layers} and window_starts >= 1; e.g. window_widths=[1, 3]")
    out: list[list[int]] = []
    for w in widths:
        last = n_layers - w
        k = min(starts, last + 1)
        firsts = sorted({round(i * last / (k - 1)) for i in range(k)}) if k > 1 else [0]
        out += [list(range(s, s + w)) for s in firsts if list(range(s, s + w)) not in out]
    return out


def reply_recall(generations: Sequence[str], rows: Sequence[QARow]) -> tuple[float, str]:
    """How much of the answers a set of greedy replies recalls: fact recall (tofu.fact_recall) when the rows are
    annotated with facts, else mean ROUGE-L recall against the answer; (value, "fact" | "rougeL")."""

    facts = fact_recall(generations, rows)
    if facts is not None:
        return facts, "fact"
    return float(np.mean(rouge_recall(generations, [r.answer for r in rows]))), "rougeL"


def replies_summary(model: Any, tokenizer: Any, rows: Sequence[QARow], max_new_tokens: int,
                    batch_size: int = 32) -> dict[str, Any]:
    """Greedy replies of `model` to the rows' questions: recall (reply_recall), degenerate share (fluency) and the
    first two replies."""

    gens = generate_answers(model, tokenizer, [r.question for r in rows], max_new_tokens=max_new_tokens,
                            batch_size=batch_size, desc="teacher replies")
    recall, measure = reply_recall(gens, rows)
    return {"recall": recall, "measure": measure, "degenerate": float(np.mean([is_degenerate(g) for g in gens])),
            "examples": gens[:2]}


def fluent_forgetting(point: dict[str, Any], base: dict[str, Any], recall_ratio: float, degenerate_max: float) -> bool:
    """A teacher-map point where facts drop while fluency holds: the teacher's forget recall is at most
    recall_ratio × θ0's and at most degenerate_max of its forget replies are degenerate (ASU's search space). Never
    when θ0 recalls nothing: there is no fact to drop."""
    return (base["forget"]["recall"] > 0 and point["forget"]["recall"] <= recall_ratio * base["forget"]["recall"]
            and point["forget"]["degenerate"] <= degenerate_max)


def recommend(grid: list[dict[str, Any]], functional_budget: float, min_factual: float) -> dict[str, Any] | None:
    """The admissible setting (functional loss ≤ budget) with the best selectivity among those whose
    factual tokens lose ≥ min_factual nats; if none lose that much, the one with the largest factual loss."""
    ok = [g for g in grid if g["n_factual"] and g["functional_shift"] >= -functional_budget]
    strong = [g for g in ok if g["factual_shift"] <= -min_factual]
    if strong:
        return max(strong, key=lambda g: (g["selectivity"], -g["factual_shift"]))
    return min(ok, key=lambda g: g["factual_shift"]) if ok else None


def calibrate(model: Any, tokenizer: Any, rows: Sequence[QARow], taus: Sequence[float],
              layer_sets: Sequence[Sequence[int] | None], *, functional_budget: float = 0.7,
              min_factual: float = 0.3, max_length: int = 256, batch_size: int = 32,
              replies: dict[str, Any] | None = None) -> dict[str, Any]:
    """Sweep (τ, layers) with the smoothed teacher alone and recommend one (see `recommend`).

    Admissible: functional tokens lose at most `functional_budget` nats on average (their probability
    stays within e^budget of θ0, so the teacher still speaks). No training; one forward per setting.
    replies (the teacher map): {"retain": rows or [], "max_new_tokens", "recall_ratio", "degenerate_max"}: each
    setting's greedy replies on the forget rows and the retain rows too (replies_summary), θ0's as "base", and
    `fluent_forgetting` per setting.
    """
    base = token_logprobs(model, tokenizer, rows, batch_size=batch_size, max_length=max_length)
    classes = classes_for(tokenizer, rows, base)
    out: dict[str, Any] = {}
    if replies is not None:
        out["base"] = _replies_point(model, tokenizer, rows, replies, batch_size)
    grid = []
    settings = [(layers, tau) for layers in layer_sets for tau in taus]
    for layers, tau in track(settings, f"calibrating: {len(settings)} (tau, layers) settings"):
        teacher = smoothed_teacher(model, tau, layers)  # one at a time, dropped before the next
        shift = class_shift(base, token_logprobs(teacher, tokenizer, rows, batch_size=batch_size,
                                                 max_length=max_length), classes)
        grid.append({"tau": float(tau), "layers": None if layers is None else list(layers),
                     "factual_shift": shift.factual, "functional_shift": shift.functional,
                     "selectivity": shift.selectivity, "n_factual": shift.n_factual,
                     "n_functional": shift.n_functional,
                     "admissible": bool(shift.functional >= -functional_budget)})
        if replies is not None:
            grid[-1].update(_replies_point(teacher, tokenizer, rows, replies, batch_size))
            grid[-1]["fluent_forgetting"] = fluent_forgetting(grid[-1], out["base"], replies["recall_ratio"],
                                                              replies["degenerate_max"])
        del teacher
    best = recommend(grid, functional_budget, min_factual)
    return {"grid": grid, "recommended": best, "functional_budget": functional_budget, "min_factual": min_factual,
            "note": None if best else "no setting kept functional tokens within the budget; raise it or lower tau",
            **out, **({"replies": {k: v for k, v in replies.items() if k != "retain"}} if replies else {})}


def _replies_point(model: Any, tokenizer: Any, rows: Sequence[QARow], replies: dict[str, Any],
                   batch_size: int) -> dict[str, Any]:
    """{"forget": replies_summary on the forget rows, "retain": on the retain rows (None without them)}."""
    n = replies["max_new_tokens"]
    return {"forget": replies_summary(model, tokenizer, rows, n, batch_size),
            "retain": replies_summary(model, tokenizer, replies["retain"], n, batch_size) if replies["retain"] else None}
