"""RWKU (Jin et al. 2024, "Real-World Knowledge Unlearning"): targets and probes from local files or
the hub, scored by ROUGE-L recall of greedy answers against the probe's answer.

Data (hub "jinzhuoran/RWKU"): config forget_target (split train) holds {target, intro}; configs
forget_level1 (fill-in-the-blank), forget_level2 (question answering), forget_level3 (adversarial
attacks), neighbor_level1 (fill-in-the-blank), neighbor_level2 (QA), split test, hold
{query, answer, subject, level ("1"/"2"/"3"), type}. A directory in the layout of RWKU's processed
data (Target/<n>_<Name>/forget_level1.json, ...) works as a local source.
Differences from RWKU's own scorer: the query goes after RWKU's instruction line ("Please complete
the blank ..." on level 1, "Please briefly answer ..." otherwise) through obliviate's one prompt
template (chat template, else "Question: ...\\nAnswer:"); RWKU adds "Answer:" after the chat template
and varies the wrapper per adversarial type. Answers are cut at the first newline as RWKU's stop
list does; ROUGE is rouge-score's ROUGE-L recall with stemming (tofu.rouge_recall), where RWKU used
the `rouge` package without stemming.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from obliviate.data.rows import read_records, split_file
from obliviate.errors import DataError
from obliviate.eval.generate import generate_answers
from obliviate.eval.metrics import MetricInfo, register
from obliviate.eval.tofu import rouge_recall
from obliviate.hub import require_hub

HUB_ID = "jinzhuoran/RWKU"
FORGET_LEVELS: tuple[str, ...] = ("forget_level1", "forget_level2", "forget_level3")
NEIGHBOR_LEVELS: tuple[str, ...] = ("neighbor_level1", "neighbor_level2")
LEVELS: tuple[str, ...] = FORGET_LEVELS + NEIGHBOR_LEVELS
BLANK_INSTRUCTION = "Please complete the blank in the following question."
QA_INSTRUCTION = "Please briefly answer the following question."

_LEVEL_DOC = {"forget_level1": "forget fill-in-the-blank probes", "forget_level2": "forget QA probes",
              "forget_level3": "forget adversarial-attack probes", "neighbor_level1": "neighbour fill-in-the-blank probes",
              "neighbor_level2": "neighbour QA probes"}


def _build_metrics() -> dict[str, MetricInfo]:
    """Forget probes: lower recall is better (forgotten); neighbour probes: higher is better (kept)."""
    infos = [MetricInfo(f"rwku_{lv}_rougeL_recall", lv in NEIGHBOR_LEVELS, 1,
                        f"RWKU {_LEVEL_DOC[lv]}: mean ROUGE-L recall of greedy answers vs answer") for lv in LEVELS]
    infos += [MetricInfo("rwku_forget_rougeL_recall", False, 1, "RWKU forget 'All': mean of the three level means"),
              MetricInfo("rwku_neighbor_rougeL_recall", True, 1, "RWKU neighbour 'All': mean of the two level means")]
    return {m.name: m for m in infos}


RWKU_METRICS: dict[str, MetricInfo] = register("rwku", _build_metrics())


@dataclass(frozen=True)
class Probe:
    """One RWKU probe: a query (with '___' for a blank on level 1) and the expected answer."""

    query: str
    answer: str
    subject: str | None = None
    level: str | None = None
    type: str | None = None


@dataclass(frozen=True)
class UnlearnTarget:
    """One RWKU unlearning target (a famous person) and its short Wikipedia intro when given."""

    target: str
    intro: str | None = None


# ---------------------------------------------------------------- validation
def _text(rec: Mapping[str, Any], key: str, where: str, *, optional: bool = False, numbers: bool = False) -> str | None:
    """A string field (numbers allowed where `numbers`, made strings); missing/empty is an error unless optional."""
    val = rec.get(key)
    if val is None:
        if optional:
            return None
        raise DataError(f"{where}: missing field {key!r}")
    if numbers and isinstance(val, (int, float)) and not isinstance(val, bool):
        val = str(val)
    if not isinstance(val, str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(val).__name__}")
    if not val.strip():
        if optional:
            return None
        raise DataError(f"{where}: field {key!r} is empty")
    return val


def probe_from_record(rec: Any, where: str) -> Probe:
    """Validate one raw record {query, answer, subject?, level?, type?} and build a Probe."""
    if not isinstance(rec, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return Probe(query=_text(rec, "query", where),  # type: ignore[arg-type]
                 answer=_text(rec, "answer", where, numbers=True),  # type: ignore[arg-type]
                 subject=_text(rec, "subject", where, optional=True),
                 level=_text(rec, "level", where, optional=True, numbers=True),
                 type=_text(rec, "type", where, optional=True))


def target_from_record(rec: Any, where: str) -> UnlearnTarget:
    """Validate one raw record {target, intro?} and build an UnlearnTarget."""
    if not isinstance(rec, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return UnlearnTarget(_text(rec, "target", where), _text(rec, "intro", where, optional=True))  # type: ignore[arg-type]


# ---------------------------------------------------------------- loading
def _hub_records(repo_id: str, config: str, split: str) -> list[tuple[str, Any]]:
    require_hub(f"RWKU source {repo_id!r}")  # seconds, not minutes of retries, when offline
    import datasets  # heavy import, only on this path

    try:
        try:
            ds = datasets.load_dataset(repo_id, config, split=split)
        except RuntimeError as exc:  # datasets>=4 refuses repos that still ship a loading script ...
            if "scripts are no longer supported" not in str(exc):
                raise
            # ... while the hub's parquet export of the same configs loads without it
            ds = datasets.load_dataset(repo_id, config, split=split, revision="refs/convert/parquet")
    except Exception as exc:  # network, unknown config, ... all become one clear message
        raise DataError(f"could not load {repo_id!r} config {config!r} split {split!r} from the hub: {exc}. "
                        "Offline? Point at a directory of <level>.json / .jsonl files instead.") from None
    return [(f"{repo_id}/{config} row {i}", dict(rec)) for i, rec in enumerate(ds)]


def _records(source: str | Path, name: str, split: str) -> list[tuple[str, Any]]:
    """Raw records of `name` from a file, a directory holding <name>.json(l), or a hub id."""
    path = Path(source)
    if path.is_file():
        return read_records(path)
    if path.is_dir():
        return read_records(split_file(path, name))
    text = str(source)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        return _hub_records(text, name, split)
    raise DataError(f"RWKU source {text!r} is neither a file, a directory, nor a hub id (owner/name)")


def load_probes(source: str | Path, level: str, *, subject: str | None = None) -> list[Probe]:
    """Probes of one level (e.g. forget_level1), optionally only those about `subject`."""
    if level not in LEVELS:
        raise DataError(f"unknown RWKU level {level!r}; valid levels: {', '.join(LEVELS)}")
    probes = [probe_from_record(rec, where) for where, rec in _records(source, level, "test")]
    if subject is not None:
        have = sorted({p.subject for p in probes if p.subject})
        probes = [p for p in probes if p.subject == subject]
        if not probes:
            raise DataError(f"{source} {level}: no probes about {subject!r}; subjects there include: "
                            f"{', '.join(have[:10]) or 'none'}")
    if not probes:
        raise DataError(f"{source} {level}: no probes")
    return probes


def load_rwku(source: str | Path = HUB_ID, levels: Sequence[str] = LEVELS, *,
              subject: str | None = None) -> dict[str, list[Probe]]:
    """{level: probes} for each of `levels`, the input of evaluate_rwku."""
    return {lv: load_probes(source, lv, subject=subject) for lv in levels}


def _target_name(path: Path) -> str:
    """'forget_target', or 'intro' in RWKU's per-target folders (Target/<n>_<Name>/intro.json)."""
    if path.is_dir() and (path / "intro.json").is_file() and not any(
            (path / f"forget_target{ext}").is_file() for ext in (".json", ".jsonl")):
        return "intro"
    return "forget_target"


def load_targets(source: str | Path = HUB_ID) -> list[UnlearnTarget]:
    """Unlearning targets: a file, a directory with forget_target.json(l), or the hub config forget_target."""
    targets = [target_from_record(rec, where) for where, rec in _records(source, _target_name(Path(source)), "train")]
    if not targets:
        raise DataError(f"{source}: no unlearning targets")
    return targets


# ---------------------------------------------------------------- scoring
def probe_question(probe: Probe, level: str) -> str:
    """What the model is asked: RWKU's instruction line (blank on level 1, QA otherwise), then the query."""
    instruction = BLANK_INSTRUCTION if level.endswith("level1") else QA_INSTRUCTION
    return f"{instruction}\n{probe.query.strip()}"


def first_line(text: str) -> str:
    """The answer up to its first newline, stripped (RWKU stops generation at a newline)."""
    return text.strip().split("\n", 1)[0].strip()


def level_means(recalls: Mapping[str, np.ndarray]) -> dict[str, float | None]:
    """RWKU_METRICS from per-level recalls [N_level]: level means and the forget/neighbour 'All' means."""
    out: dict[str, float | None] = {name: None for name in RWKU_METRICS}
    for lv, r in recalls.items():
        out[f"rwku_{lv}_rougeL_recall"] = float(np.mean(r))
    for group, levels in (("forget", FORGET_LEVELS), ("neighbor", NEIGHBOR_LEVELS)):
        if all(lv in recalls for lv in levels):
            out[f"rwku_{group}_rougeL_recall"] = float(np.mean([np.mean(recalls[lv]) for lv in levels]))
    return out


def evaluate_rwku(model: Any, tokenizer: Any, probes_by_level: Mapping[str, Sequence[Probe]], *,
                  max_new_tokens: int = 30, batch_size: int = 16) -> dict[str, Any]:
    """RWKU per-level mean ROUGE-L recall of greedy answers (RWKU: 30 new tokens), generations and notes."""
    unknown = sorted(set(probes_by_level) - set(LEVELS))
    if unknown or not probes_by_level:
        raise DataError(f"probes_by_level must be a non-empty dict keyed by {', '.join(LEVELS)}; "
                        f"unknown: {', '.join(unknown) or 'none'}")
    empty = [lv for lv, probes in probes_by_level.items() if not probes]
    if empty:
        raise DataError(f"RWKU levels without probes: {', '.join(empty)}")
    order = [lv for lv in LEVELS if lv in probes_by_level]
    questions = [probe_question(p, lv) for lv in order for p in probes_by_level[lv]]
    raw = generate_answers(model, tokenizer, questions, max_new_tokens=max_new_tokens, batch_size=batch_size)
    recalls: dict[str, np.ndarray] = {}
    generations: dict[str, list[str]] = {}
    start = 0
    for lv in order:
        probes = probes_by_level[lv]
        gens = [first_line(g) for g in raw[start:start + len(probes)]]
        start += len(probes)
        generations[lv] = gens
        recalls[lv] = rouge_recall(gens, [p.answer for p in probes])
    out: dict[str, Any] = level_means(recalls)
    out["notes"] = [f"rwku_{g}_rougeL_recall undefined: needs all of {', '.join(lvs)}"
                    for g, lvs in (("forget", FORGET_LEVELS), ("neighbor", NEIGHBOR_LEVELS))
                    if not all(lv in recalls for lv in lvs)]
    out["n"] = {lv: len(probes_by_level[lv]) for lv in order}
    out["rougeL_recall_per_example"] = {lv: r.tolist() for lv, r in recalls.items()}
    out["generations"] = generations
    return out


# ---------------------------------------------------------------- training batches (SAGO's setup_data.py)
BATCH_FILES: dict[str, str] = {  # file written -> RWKU config it filters (hub split: train for passages/targets)
    "passage.json": "train_original_passage", "intro.json": "forget_target",
    **{f"{lv}.json": lv for lv in LEVELS}}


def _subject(rec: Any, key: str, where: str) -> str:
    """The subject (or target) a raw RWKU record is about; a clear error when it has none."""
    if not isinstance(rec, Mapping) or not isinstance(rec.get(key), str):
        raise DataError(f"{where}: expected a JSON object with a string field {key!r}")
    return rec[key]


def batch_files(source: str | Path, n_targets: int) -> dict[str, list[dict[str, Any]]]:
    """The files of an RWKU training batch "1-N" as sustech-nlp/SAGO setup_data.py:91-179 writes them: every record
    of train_original_passage, the probe levels and forget_target about one of the first N targets (forget_target's
    order), and retain_passage.json = the passages of the last N targets. {file name: records}."""
    names = [_subject(rec, "target", where) for where, rec in _records(source, _target_name(Path(source)), "train")]
    if not 1 <= n_targets <= len(names) // 2:
        raise DataError(f"{n_targets} targets asked for, but {source} lists {len(names)}: the forget batch (the first "
                        f"N) and the retain batch (the last N) must not overlap; choose 1 <= N <= {len(names) // 2}")
    forget, retain = set(names[:n_targets]), set(names[-n_targets:])
    out: dict[str, list[dict[str, Any]]] = {}
    for file, config in BATCH_FILES.items():
        key, split = ("target", "train") if config == "forget_target" else \
            ("subject", "train" if config.startswith("train") else "test")
        name = _target_name(Path(source)) if config == "forget_target" else config
        records = [(dict(rec), _subject(rec, key, where)) for where, rec in _records(source, name, split)]
        out[file] = [rec for rec, subject in records if subject in forget]
        if file == "passage.json":
            out["retain_passage.json"] = [rec for rec, subject in records if subject in retain]
    empty = [file for file, recs in out.items() if not recs]
    if empty:
        raise DataError(f"{source}: no records about the batch's targets in {', '.join(empty)}")
    return out

