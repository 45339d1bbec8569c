"""Trial bookkeeping shared by a sweep's workers: who runs a trial (WORKER), whether it is alive (its heartbeat),
which trials are stale, which count against the budget, which are repeats of a best trial, a recipe to queue again,
and what every worker must measure against (digests of θ0's and the retain model's weights and of the rows)."""
from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Iterable

from obliviate.errors import ObliviateError
from obliviate.receipt.digests import model_hashes, weights_digest

WORKER = f"{socket.gethostname()}:{os.getpid()}"
ORPHAN_S = 30.0  # seconds after which a running trial that never named its worker counts as stale


def _alive(worker: str) -> bool:
    """Whether a worker id on this machine names a running process (other machines: assumed alive)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    if int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_stale(study: Any, stale_after_s: float, now: float | None = None) -> int:
    """Fail the running trials whose worker is gone (this machine) or silent for stale_after_s; how many."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    now = time.time() if now is None else now
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = t.user_attrs.get("heartbeat", t.datetime_start.timestamp() if t.datetime_start else now)
        worker = t.user_attrs.get("worker", "")
        # a worker names itself right after asking for a trial: a nameless one older than ORPHAN_S died in between
        orphan = not worker and now - beat > min(ORPHAN_S, stale_after_s)
        if (worker and not _alive(worker)) or orphan or now - beat > stale_after_s:
            try:
                study._storage.set_trial_user_attr(t._trial_id, "stale", True)
                study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                n += 1
            except (UpdateFinishedTrialError, RuntimeError):
                pass
    return n


def counts(trial: Any) -> bool:
    """Whether a trial uses the budget: finished (complete, pruned, failed by its own error) or running. Trials
    failed because their worker stopped (interrupted, stale) are done again; surplus ones never ran."""
    from optuna.trial import TrialState

    if "surplus" in trial.user_attrs:
        return False
    if trial.state == TrialState.FAIL:
        return "error" in trial.user_attrs
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


def surplus(study: Any, trial: Any, budget: int) -> bool:
    """Two workers that both saw one trial left both ask for it: the later trial (by number) is over the budget;
    likewise a repeat whose seed an earlier repeat of the same best already took, and a recipe an earlier trial
    already ran or runs (both workers queued it)."""
    if trial.user_attrs.get("recipe") and any(t.number < trial.number and counts(t) and t.user_attrs.get("recipe")
                                              for t in study.get_trials(deepcopy=False)):
        return True
    if is_repeat(trial):
        seed, of = trial.user_attrs.get("seed"), trial.user_attrs["repeat_of"]
        return any(t.number < trial.number and counts(t) and t.user_attrs.get("repeat_of") == of
                   and t.user_attrs.get("seed") == seed for t in study.get_trials(deepcopy=False))
    before = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number and not is_repeat(t) and counts(t)]
    return len(before) >= budget


def is_repeat(trial: Any) -> bool:
    return "repeat_of" in trial.user_attrs


MAX_CLASHES = 3  # proposals a worker drops in a row as clashes before it runs one anyway (a space of one point)


def clash(study: Any, trial: Any, queued: bool) -> bool:
    """Two workers that read a study at the same moment seed their samplers alike (make_sampler) and draw the same
    point: True when the asked `trial` is a proposal whose point (its fixed params) an earlier trial, waiting or
    running, already holds, or has no point though one waited (`queued`: another worker took it, and this trial's
    sampler would draw it again). Recipes, queued points and repeats have their own rule (surplus)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    me = next(t for t in trials if t.number == trial.number)
    point = me.system_attrs.get("fixed_params")
    if point is None:
        return queued
    if not point or is_repeat(me) or me.user_attrs.get("recipe") or me.user_attrs.get("queued"):
        return False  # a method without dimensions: every trial is the one point
    return any(t.number < me.number and t.state in (TrialState.RUNNING, TrialState.WAITING) and not is_repeat(t)
               and t.system_attrs.get("fixed_params") == point for t in trials)


class Heartbeat:
    """A thread that stamps the running trial every few seconds so other workers know it is alive."""

    def __init__(self, study: Any, trial_id: int, every_s: float) -> None:
        self.study, self.trial_id, self.every_s = study, trial_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.study._storage.set_trial_user_attr(self.trial_id, "heartbeat", time.time())
            except Exception:  # the trial ended meanwhile, or the storage is briefly busy: the next beat tries again
                pass

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def model_digests(original: Any, retain_model: Any = None) -> dict[str, str]:
    """SHA-256 weight digests (receipt/digests.py) of the models every trial is measured against: θ0 and, where the
    track has one, the retain model whose truth ratios give forget quality."""
    out = {"original": model_digest(original)}
    if retain_model is not None:
        out["retain"] = model_digest(retain_model)
    return out


def model_digest(model: Any) -> str:
    """One model's SHA-256 weight digest, as a study records it (receipt/digests.py over its tensors)."""
    return weights_digest(model_hashes(model))


WHAT = {"original": "θ0's weights", "retain": "the retain model's weights", "rows": "rows (training, evaluation, cut)"}


def check_models(studies: Iterable[Any], digests: dict[str, str]) -> None:
    """Each study's trials were measured against these models and rows (digests recorded by its first worker; a
    digest the study lacks is recorded now); a worker with others (a target fine-tuned again, a probe that kept
    other facts on another machine) is refused."""
    for study in studies:
        recorded = dict(study.user_attrs.get("models") or {})
        changed = sorted(k for k in digests if k in recorded and recorded[k] != digests[k])
        if changed:
            raise ObliviateError(
                f"the storage's study {study.study_name!r} was made with other {', '.join(WHAT.get(k, k) for k in changed)}"
                f" ({', '.join(f'{k} {recorded[k][:12]} there, {digests[k][:12]} here' for k in changed)}): its θ0 "
                "evaluation and trials do not describe this worker's; load the models and data it was made with, or "
                "use another output_dir / storage")
        if any(k not in recorded for k in digests):
            study.set_user_attr("models", {**recorded, **digests})


def requeue_recipe(study: Any, recipe: dict[str, Any] | None) -> bool:
    """Queue a method's recipe again when the trial that ran it stopped with its worker (interrupted, stale) and no
    other trial holds it: the recipe stays the first point of every study; whether it was queued."""
    from optuna.trial import TrialState

    if recipe is None or not study.user_attrs.get("recipe"):
        return False
    held = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("recipe")]
    if not held or any(counts(t) or t.state == TrialState.WAITING for t in held):
        return False
    study.enqueue_trial(recipe, user_attrs={"recipe": True})
    return True


def repeats_of(study: Any, number: int) -> list[Any]:
    """The repeats of trial `number` that ran, run or wait to run (a repeat failed by its stopped worker is redone)."""
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("repeat_of") == number and (counts(t) or t.state == TrialState.WAITING)]


def repeat_waiting(study: Any) -> bool:
    """A repeat waits to run in the study (queued for its current best, a stopped worker's included)."""
    from optuna.trial import TrialState

    return any(is_repeat(t) and t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False))
