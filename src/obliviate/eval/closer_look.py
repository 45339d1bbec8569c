"""FE and MU as the closer-look protocol defines them (Yuan et al. 2024, "A Closer Look at Machine
Unlearning for Large Language Models"; docs/METRICS.md §4, the FE and MU the ASU paper reports).

Six numbers per split, built on tofu.py's SplitResult (nothing is generated twice):
- ROUGE-L recall and Probability: tofu.py's, unchanged (ra/wf Prob normalised over perturbed answers).
- Truth Ratio, key `<split>_cl_truth_ratio`: R = exp(mean perturbed loss - correct loss) = 1 / TOFU's
  TR. Forget: 1 - mean(min(R, 1/R)) = 1 - tofu's forget_truth_ratio (min(R, 1/R) is symmetric);
  others: mean(max(0, 1 - 1/R)) = mean(max(0, 1 - TR)) = tofu's <split>_truth_ratio.
- Token Entropy: fluency.token_entropy of each generation under the evaluated LM's tokenizer, mean.
- Cosine Similarity: mean-pooled sentence embeddings of generation vs gold, cosine clipped to [0, 1].
- Entailment Score: share of generations the NLI model's top label calls entailment; ROUGE-L recall
  < 0.1 counts as not entailed. Order as in the authors' TOFU code: forget premise = generation,
  hypothesis = gold ("does the output state the fact?"); other splits premise = gold, hypothesis =
  generation ("does the output follow from the answer?").
MU = hmean of the 18 numbers on retain/ra/wf; FE = 1 - mean of the five forget numbers other than
Token Entropy (all five are "higher = still remembered"). A component whose model cannot be loaded
is left out, never replaced: `mu` / `fe` are then null and the aggregate over what is present is
reported as `mu_partial` / `fe_partial` (never under the full name); `mu_components` /
`fe_components` list what went in, notes say what is missing and why.
Gold text for cosine/NLI is the row's answer unless `golds` says otherwise (the authors used a
full-sentence `original_answer` on ra/wf, which TOFU's files lack; ROUGE stays against the answer).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from obliviate.data.rows import QARow
from obliviate.errors import ConfigError
from obliviate.eval.fluency import token_entropy
from obliviate.eval.metrics import MetricInfo, register
from obliviate.eval.tofu import KINDS, METRICS, SPLIT_WHERE, UTILITY_SPLITS, SplitResult, evaluate_split, harmonic_mean

DEFAULT_EMBEDDING = "sentence-transformers/paraphrase-MiniLM-L6-v2"
DEFAULT_NLI = "sileod/deberta-v3-base-tasksource-nli"
PARTS: tuple[str, ...] = ("rougeL_recall", "prob", "cl_truth_ratio", "token_entropy", "cosine_similarity",
                          "entailment_score")
FE_PARTS: tuple[str, ...] = tuple(p for p in PARTS if p != "token_entropy")
MU_KEYS: tuple[str, ...] = tuple(f"{s}_{p}" for s in UTILITY_SPLITS for p in PARTS)
FE_KEYS: tuple[str, ...] = tuple(f"forget_{p}" for p in FE_PARTS)
ENTAIL_MIN_ROUGE = 0.1
# The authors' evaluation protocol (sail-sg/closer-look-LLM-unlearning config/tofu.yaml): `ds_size: 300` rows of
# each split, and `generation.max_length: 200` with max_new_tokens null, i.e. prompt + answer <= 200 tokens in
# generate() and in the scored QA sequences (metrics.py builds its TextDatasetQA with that max_length).
PROTOCOL_ROWS = 300
PROTOCOL_MAX_LENGTH = 200
GENERATION_IS_PREMISE = {"forget": True, "retain": False, "real_authors": False, "world_facts": False}
ROW_NAMES = {"entailed": "entailment_score"}  # CloserLookSplit.per's names as the numbers they average to
COMPONENT = {"cosine_similarity": ("embedding", "Cosine Similarity"),
             "entailment_score": ("nli", "Entailment Score")}


# ---------------------------------------------------------------- pure aggregation
def closer_look_ratio(tofu_tr: np.ndarray) -> np.ndarray:
    """R = exp(mean_i perturbed_i - correct) = 1 / TOFU's TR (closer-look code's statistic). [N] -> [N]."""
    with np.errstate(divide="ignore"):
        return 1.0 / np.asarray(tofu_tr, dtype=np.float64)


def cl_truth_ratio(r: np.ndarray, kind: str) -> float:
    """Closer-look Truth Ratio from R [N]: forget 1 - mean(min(R, 1/R)); others mean(max(0, 1 - 1/R))."""
    r = np.asarray(r, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"cl_truth_ratio needs a non-empty 1-D array of ratios, got shape {r.shape}")
    with np.errstate(divide="ignore"):
        inv = 1.0 / r
    if kind == "forget":
        return float(1.0 - np.mean(np.minimum(r, inv)))
    return float(np.mean(np.maximum(0.0, 1.0 - inv)))


def clipped_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of [N, D] embeddings clipped to [0, 1] (closer-look max(0, cos)); a zero vector gives 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"clipped_cosine needs two [N, D] arrays of one shape; got {a.shape} and {b.shape}")
    denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.where(denom > 0, (a * b).sum(axis=1) / np.where(denom > 0, denom, 1.0), 0.0)
    return np.clip(cos, 0.0, 1.0)  # the upper clip only absorbs rounding (identical texts: 1 + 1e-16)


def entailment_score(entailed: np.ndarray, rouge: np.ndarray, min_rouge: float = ENTAIL_MIN_ROUGE) -> float:
    """Share labelled entailment with ROUGE-L recall >= 0.1 (below: not entailed). [N], [N] -> scalar."""
    e, r = np.asarray(entailed, dtype=bool), np.asarray(rouge, dtype=np.float64)
    if e.shape != r.shape or e.ndim != 1 or e.size == 0:
        raise ValueError(f"entailment_score needs two non-empty [N] arrays; got {e.shape} and {r.shape}")
    return float(np.mean(e & (r >= min_rouge)))


def nli_pairs(kind: str, generations: Sequence[str], golds: Sequence[str]) -> tuple[list[str], list[str]]:
    """(premises, hypotheses): forget (generation, gold), other splits (gold, generation), as the authors' code."""
    if GENERATION_IS_PREMISE[kind]:
        return list(generations), list(golds)
    return list(golds), list(generations)


def _present(values: Mapping[str, float | None], keys: Sequence[str], what: str) -> tuple[list[str], np.ndarray]:
    used = [k for k in keys if values.get(k) is not None]
    nums = np.array([float(values[k]) for k in used], dtype=np.float64)  # type: ignore[arg-type]
    bad = [k for k, v in zip(used, nums) if not (np.isfinite(v) and 0 <= v <= 1)]
    if bad:
        raise ValueError(f"{what} needs numbers in [0, 1]; bad: {', '.join(bad)}")
    return used, nums


def model_utility_mu(values: Mapping[str, float | None]) -> tuple[float | None, list[str]]:
    """Closer-look MU: hmean of the MU_KEYS present (18 when complete); a zero gives 0. -> (MU or None, keys used)."""
    used, nums = _present(values, MU_KEYS, "MU")
    if not used:
        return None, []
    return (0.0 if np.any(nums == 0) else harmonic_mean(nums)), used


def forget_efficacy(values: Mapping[str, float | None]) -> tuple[float | None, list[str]]:
    """Closer-look FE: 1 - mean of the FE_KEYS present (5 when complete). -> (FE or None, keys used)."""
    used, nums = _present(values, FE_KEYS, "FE")
    return (float(1.0 - nums.mean()) if used else None), used


# ---------------------------------------------------------------- models
def entailment_id(id2label: Mapping[Any, str]) -> int:
    """The class id whose label contains 'entail' (case-insensitive; not 'not_entailment'); ConfigError otherwise."""
    hits = [int(i) for i, lab in id2label.items()
            if "entail" in lab.lower() and not re.match(r"no[nt]", lab.lower())]
    if len(hits) != 1:
        raise ConfigError(f"NLI model: expected exactly one entailment label in config.id2label, got "
                          f"{dict(id2label)}; use an NLI classifier whose id2label names 'entailment'")
    return hits[0]


def _from_pretrained(ident: str, auto_name: str, local_files_only: bool) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode) from a local directory or hub id; OSError for a missing local path."""
    import transformers

    if not Path(ident).expanduser().exists() and ident.startswith(("/", ".", "~")):
        raise OSError(f"no such directory {ident}")
    tok = transformers.AutoTokenizer.from_pretrained(ident, local_files_only=local_files_only)
    model = getattr(transformers, auto_name).from_pretrained(ident, local_files_only=local_files_only)
    return tok, model.eval()


def _reason(exc: Exception) -> str:
    """'<ExceptionType>: <first line of its message>' (hub errors run to many lines)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@dataclass
class CloserLookModels:
    """The embedding and NLI models (hub ids or local paths; None = not used), each loaded on first use."""

    embedding: str | None = DEFAULT_EMBEDDING
    nli: str | None = DEFAULT_NLI
    device: str = "cpu"
    batch_size: int = 32
    embed_max_length: int = 128  # sentence-transformers' max_seq_length for paraphrase-MiniLM-L6-v2
    nli_max_length: int = 512
    local_files_only: bool = False  # True: never touch the network (unset, an offline hub retries ~50 s per model)
    failures: dict[str, str] = field(default_factory=dict)
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)

    def get(self, which: str) -> Any | None:
        """(tokenizer, model) for 'embedding', (tokenizer, model, entailment id) for 'nli'; None if unavailable."""
        ident = getattr(self, which)
        if ident is None or which in self.failures:
            return None
        if which not in self._loaded:
            try:
                auto = "AutoModel" if which == "embedding" else "AutoModelForSequenceClassification"
                tok, model = _from_pretrained(ident, auto, self.local_files_only)
            except Exception as exc:  # offline, missing, unreadable: the component is omitted, with the reason
                self.failures[which] = _reason(exc)
                return None
            extra = (entailment_id(model.config.id2label),) if which == "nli" else ()
            self._loaded[which] = (tok, model.to(self.device), *extra)
        return self._loaded[which]

    def omission(self, part: str) -> str:
        """The note saying why `part` (cosine_similarity / entailment_score) was left out."""
        which, title = COMPONENT[part]
        ident = getattr(self, which)
        if ident is None:
            return f"{title} omitted: no {which} model configured"
        return f"{title} omitted: could not load {ident}: {self.failures.get(which, 'unknown reason')}"


def load_closer_look_models(embedding: str | None = DEFAULT_EMBEDDING, nli: str | None = DEFAULT_NLI, *,
                            device: str = "cpu", batch_size: int = 32, local_files_only: bool = False
                            ) -> CloserLookModels:
    """CloserLookModels with both loads tried now (failures recorded in .failures, not raised)."""
    models = CloserLookModels(embedding, nli, device=device, batch_size=batch_size,
                              local_files_only=local_files_only)
    models.get("embedding")
    models.get("nli")
    return models


def embed(models: CloserLookModels, texts: Sequence[str]) -> np.ndarray | None:
    """Mean-pooled (attention mask) last hidden states, as sentence-transformers pools MiniLM. -> [N, D] or None."""
    loaded = models.get("embedding")
    if loaded is None:
        return None
    tok, model = loaded
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), models.batch_size):
            enc = tok(list(texts[i:i + models.batch_size]), padding=True, truncation=True,
                      max_length=models.embed_max_length, return_tensors="pt").to(models.device)
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size))


def nli_entails(models: CloserLookModels, premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray | None:
    """Whether the NLI model's top label (the text-classification pipeline's) is entailment. -> [N] bool or None."""
    loaded = models.get("nli")
    if loaded is None:
        return None
    tok, model, entail = loaded
    limit = min(models.nli_max_length, getattr(model.config, "max_position_embeddings", models.nli_max_length))
    out = []
    with torch.no_grad():
        for i in range(0, len(premises), models.batch_size):
            enc = tok(list(premises[i:i + models.batch_size]), list(hypotheses[i:i + models.batch_size]),
                      padding=True, truncation=True, max_length=limit, return_tensors="pt").to(models.device)
            out.append((model(**enc).logits.argmax(-1) == entail).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


# ---------------------------------------------------------------- per split and overall
@dataclass
class CloserLookSplit:
    """The six closer-look numbers of one split (None = left out), per-example arrays [N] and notes."""

    kind: str
    values: dict[str, float | None]
    per_example: dict[str, np.ndarray]
    notes: list[str]


def closer_look_split(result: SplitResult, lm_tokenizer: Any, models: CloserLookModels, *,
                      golds: Sequence[str]) -> CloserLookSplit:
    """Closer-look numbers of one split from its TOFU SplitResult, the LM tokenizer and the two models."""
    gens, n, kind, rouge = result.generations, len(result.generations), result.kind, result.rougeL_recall
    if len(golds) != n:
        raise ValueError(f"closer_look_split({kind}): {n} generations but {len(golds)} gold answers")
    ent = np.array([token_entropy(g, lm_tokenizer) for g in gens])
    vecs = embed(models, list(gens) + list(golds))
    cos = None if vecs is None else clipped_cosine(vecs[:n], vecs[n:])
    entailed = nli_entails(models, *nli_pairs(kind, gens, golds))
    values: dict[str, float | None] = {
        "rougeL_recall": float(rouge.mean()), "prob": None if result.prob is None else float(result.prob.mean()),
        "cl_truth_ratio": None if result.truth_ratio is None
        else cl_truth_ratio(closer_look_ratio(result.truth_ratio), kind),
        "token_entropy": float(ent.mean()), "cosine_similarity": None if cos is None else float(cos.mean()),
        "entailment_score": None if entailed is None else entailment_score(entailed, rouge)}
    per = {"token_entropy": ent, **({} if cos is None else {"cosine_similarity": cos}),
           **({} if entailed is None else {"entailed": entailed & (rouge >= ENTAIL_MIN_ROUGE)})}
    notes = [f"{kind}: {title} missing (no usable perturbed answers)"
             for p, title in (("prob", "Probability"), ("cl_truth_ratio", "Truth Ratio")) if values[p] is None]
    return CloserLookSplit(kind, values, per, notes)


def evaluate_closer_look(model: Any, tokenizer: Any, splits: Mapping[str, Sequence[QARow]], *,
                         models: CloserLookModels, tofu_results: Mapping[str, SplitResult] | None = None,
                         golds: Mapping[str, Sequence[str]] | None = None, max_new_tokens: int = 200,
                         batch_size: int = 16, max_length: int = 256,
                         max_total_tokens: int | None = None) -> dict[str, Any]:
    """Closer-look FE, MU and the six numbers per split; tofu_results are reused, missing ones evaluated. `rows`:
    the per-row values of token entropy, cosine similarity and entailment score, each list's mean the number."""
    unknown = sorted(set(splits) - set(KINDS))
    if unknown or not splits:
        raise ValueError(f"splits must be a non-empty dict keyed by {', '.join(KINDS)}; unknown: {unknown or 'none'}")
    out: dict[str, Any] = {name: None for name in CLOSER_LOOK_METRICS}
    notes: list[str] = []
    per_row: dict[str, list[float]] = {}
    for kind in (k for k in KINDS if k in splits):
        rows = splits[kind]
        res = (tofu_results or {}).get(kind)
        if res is None:
            res = evaluate_split(model, tokenizer, rows, kind=kind,  # type: ignore[arg-type]
                                 max_new_tokens=max_new_tokens, batch_size=batch_size, max_length=max_length,
                                 max_total_tokens=max_total_tokens)
        elif len(res.generations) != len(rows) or res.kind != kind:
            raise ValueError(f"tofu_results[{kind!r}] is a {res.kind!r} result of {len(res.generations)} rows; "
                             f"the split has {len(rows)}")
        gold = (golds or {}).get(kind) or [r.answer for r in rows]
        split = closer_look_split(res, tokenizer, models, golds=gold)
        out.update({f"{kind}_{p}": v for p, v in split.values.items()})
        per_row.update({f"{kind}_{ROW_NAMES.get(p, p)}": [float(x) for x in v] for p, v in split.per_example.items()})
        notes += split.notes
    notes += [models.omission(p) for p in COMPONENT if models.get(COMPONENT[p][0]) is None]
    out.update(_aggregate(out, notes))
    out["closer_look_models"] = {w: (getattr(models, w) if models.get(w) is not None else None)
                                 for w in ("embedding", "nli")}
    out["notes"] = notes
    out["rows"] = per_row
    return out


def partial_aggregates(values: Mapping[str, float | None]) -> tuple[dict[str, Any], list[str]]:
    """MU and FE under their names only when complete; else null there and the aggregate over what is present
    as mu_partial / fe_partial, with one note each naming what was left out. -> (keys, notes)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    for name, (value, used), keys in (("mu", model_utility_mu(values), MU_KEYS),
                                      ("fe", forget_efficacy(values), FE_KEYS)):
        complete = len(used) == len(keys)
        out |= {name: value if complete else None, f"{name}_partial": None if complete else value,
                f"{name}_components": used, f"{name}_complete": complete}
        if not complete:
            absent = [k for k in keys if k not in used]
            notes.append(f"{name} is null (incomplete): {name}_partial is over {len(used)} of {len(keys)} numbers; "
                         f"left out: {', '.join(absent)}")
    return out, notes


def _aggregate(values: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """partial_aggregates, its notes appended to `notes`."""
    out, more = partial_aggregates(values)
    notes.extend(more)
    return out


_DOC = {"cl_truth_ratio": "mean(max(0, 1 - 1/R)), R = 1/TOFU TR (= TOFU <split>_truth_ratio)",
        "token_entropy": "mean normalised unigram entropy of greedy answers (LM tokenizer)",
        "cosine_similarity": "mean max(0, cos) of mean-pooled sentence embeddings, answer vs gold",
        "entailment_score": "share of answers an NLI model labels entailment (ROUGE-L recall < 0.1: not)"}
_FORGET_TR_DOC = "1 - mean(min(R, 1/R)), R = 1/TOFU TR (= 1 - TOFU forget_truth_ratio)"


def _build_metrics() -> dict[str, MetricInfo]:
    """CLOSER_LOOK_METRICS: on the forget set all but token entropy are lower-is-better; elsewhere higher."""
    infos = [MetricInfo("fe", True, 2, "closer-look forget efficacy: 1 - mean of the 5 forget numbers but entropy; "
                                       "null unless all 5 are present"),
             MetricInfo("mu", True, 2, "closer-look model utility: hmean of 6 numbers x {retain, ra, wf}; null "
                                       "unless all 18 are present"),
             MetricInfo("fe_partial", True, 1, "FE over the forget numbers present when some are missing (no "
                                               "embedding / NLI model): NOT the closer-look FE; see fe_components"),
             MetricInfo("mu_partial", True, 1, "MU over the numbers present when some are missing (no embedding / "
                                               "NLI model): NOT the closer-look MU; see mu_components")]
    for s in KINDS:
        for p in PARTS:
            name, up = f"{s}_{p}", s != "forget" or p == "token_entropy"
            if name in METRICS:  # tofu.py's own numbers, same definition: one MetricInfo
                infos.append(METRICS[name])
                continue
            doc = _FORGET_TR_DOC if name == "forget_cl_truth_ratio" else _DOC[p]
            infos.append(MetricInfo(name, up, 1, f"{SPLIT_WHERE[s]}: {doc}"))
    return {m.name: m for m in infos}


CLOSER_LOOK_METRICS: dict[str, MetricInfo] = register("closer_look", _build_metrics())
