"""The retain model's outputs, recorded once in a TOFU sweep's storage: what every trial measures against it (its
forget truth ratios for forget quality; its Min-K% AUC and per-row losses on forget + holdout for PrivLeak and the
reference attack) is fixed by its weights and the rows, so the first worker that loads it writes them into each
study (`retain_outputs`), later workers read them instead of scoring it again in every trial, and a worker without
the retain model's files (a fresh machine that has not fine-tuned it) runs on the record, to the same numbers."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from obliviate.errors import ConfigError, ObliviateError
from obliviate.modeling.sources import check_model_source
from obliviate.sweep.storage import all_studies

RECORD_KEY = "retain_outputs"


def recorded(studies: Iterable[Any]) -> dict[str, Any] | None:
    """The record of the retain model's outputs the studies hold (the fullest one: each worker may have added the
    scores of rows its trials met), else None."""
    found = [s.user_attrs.get(RECORD_KEY) for s in studies]
    found = [r for r in found if isinstance(r, dict) and r.get("forget_tr") is not None]
    return max(found, key=lambda r: len(r.get("scores") or {})) if found else None


def record(studies: Iterable[Any], track: Any) -> bool:
    """Write the track's retain outputs into every study whose record lacks some of them (only a track that ran the
    retain model itself records); whether anything was written."""
    if getattr(track, "retain_model", None) is None or getattr(track, "retain_tr", None) is None:
        return False
    out = {"forget_tr": [float(x) for x in track.retain_tr], "scores": dict(track.retain_scores)}
    wrote = False
    for study in studies:
        have = study.user_attrs.get(RECORD_KEY) or {}
        if have.get("forget_tr") != out["forget_tr"] or set(out["scores"]) - set(have.get("scores") or {}):
            study.set_user_attr(RECORD_KEY, {"forget_tr": out["forget_tr"],
                                             "scores": {**(have.get("scores") or {}), **out["scores"]}})
            wrote = True
    return wrote


def absent(path: str | None) -> bool:
    """A retain model that is neither a local folder here nor a model the hub (or its cache, offline) has: what the
    pre-flight's model check refuses."""
    return bool(path) and not Path(path).expanduser().exists() and _refused(str(path))


@lru_cache(maxsize=8)
def _refused(path: str) -> bool:
    try:
        check_model_source(path, "eval.retain_model")
    except ObliviateError:
        return True
    return False


def missing_error(path: str, why: str) -> ConfigError:
    """The error for a retain model that is not here and whose record cannot stand in for it (`why`), with the fix."""
    return ConfigError(f"eval.retain_model {path!r}: not found, and {why}: make the retain model first (e.g. obliviate "
                       "finetune), or run this worker where it is (a worker that loads it records its outputs for the "
                       "others)")


def check_new(track: Any, resuming: bool) -> None:
    """Before a sweep writes anything: a new storage holds no record, so an absent retain model is an error now."""
    path = getattr(getattr(track.cfg, "eval", None), "retain_model", None)
    if absent(path) and not resuming:
        raise missing_error(path, "this sweep is new, so no storage records its outputs to stand in for it")


def stand_in(track: Any, path: str, log: Any) -> None:
    """Where eval.retain_model is not on this machine: the storage's record stands in for it, else the error."""
    rec = track.recorded
    if not rec:
        raise missing_error(path, "this sweep's storage records none of its outputs to stand in for it")
    n = len(track.splits.get("forget") or [])
    if len(rec["forget_tr"]) != n:
        raise missing_error(path, f"the storage's record of it holds {len(rec['forget_tr'])} forget truth ratios for "
                                  f"{n} forget rows")
    ev = track.ev
    if getattr(ev, "memorization", False) and getattr(ev, "holdout_split", None) and not rec.get("scores"):
        raise missing_error(path, "the storage's record of it holds no scores on forget + holdout rows yet (a worker "
                                  "that has it records them with its first trial)")
    import numpy as np

    track.retain_tr = np.asarray(rec["forget_tr"], dtype=np.float64)
    log(f"eval.retain_model {path}: not on this machine; its outputs recorded in the storage stand in for it "
        f"({n} forget truth ratios, {len(rec.get('scores') or {})} scored row sets)")


SAME = ("base", "set", "heldout_share", "seed")  # the config keys the retain model's outputs depend on (with the rows)


def adopt(source: str, target: str) -> int:
    """Copy the record of the retain model's outputs from one sweep storage (`source`, a database URL) into another's
    studies that lack one, where both were measured against the same weights and rows (their `models` digests) under
    the same base, overrides, held-out cut and seed: the same outputs (a record without scores is not copied). How
    many studies received it."""
    def key(study: Any) -> Any:
        config = study.user_attrs.get("config") or {}
        return study.user_attrs.get("models"), [config.get(k) for k in SAME]

    records = [(key(s), r) for s in all_studies(source) if (r := recorded([s])) and r.get("scores")]
    n = 0
    for study in all_studies(target):
        match = [r for k, r in records if k == key(study) and k[0]]
        if match and not recorded([study]):
            study.set_user_attr(RECORD_KEY, max(match, key=lambda r: len(r.get("scores") or {})))
            n += 1
    return n


if __name__ == "__main__":  # python -m obliviate.sweep.retained SOURCE_DB TARGET_DB (scripts/tofu20_study.sh)
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m obliviate.sweep.retained SOURCE.db TARGET.db")
    print(f"the retain model's recorded outputs copied into {adopt(*(f'sqlite:///{p}' for p in sys.argv[1:]))} "
          f"studies of {sys.argv[2]}")
