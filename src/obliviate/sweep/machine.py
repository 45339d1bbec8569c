"""Which CPU kernels a study's fine-tuned models were made with, so that a machine whose kernels round differently is
told before it spends the fine-tunes, not after (sweep/workers.py refuses other weights only once they exist).

A fingerprint is the SHA-256 of what the fine-tune's arithmetic gives on fixed inputs: float32 matrix products at
SmolLM2-135M's widths forward and backward (MLP 576 -> 1536 -> 576, a 49,152-token output layer), RMS norm, SiLU,
cross-entropy and one AdamW step, on torch's default threads. The study records it (key "kernels": one entry per
fingerprint, with the CPU and the variables it was taken with) once its target's weights are checked on a machine; a
later machine probes each environment of KNOWN in a fresh process (MKL reads its variables when it loads) and takes
the first whose fingerprint the study records, or is told that none is. Kernels seen fine-tuning other weights are
recorded too (key "kernels_other"), so that before any machine of the study's kind has recorded its own, a machine
whose every known setting is among them is stopped before its fine-tunes.

    python -m obliviate.sweep.machine env STUDY.db [MORE.db]  # shell `export` lines of the matching environment
    python -m obliviate.sweep.machine record STUDY.db TARGET   # check the target's weights, record the fingerprint
    python -m obliviate.sweep.machine retain STUDY.db RETAIN   # check the retain model's weights (audits' 0%)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from obliviate.errors import ObliviateError
from obliviate.modeling.load import load_model
from obliviate.sweep.storage import all_studies
from obliviate.sweep.workers import model_digest

KEY = "kernels"  # kernels whose fine-tune gave the study's weights
OTHER = "kernels_other"  # kernels seen fine-tuning other weights (with the digest they gave)
# native kernels; MKL's AVX2 code path (MKL_ENABLE_INSTRUCTIONS is read on Intel CPUs only: a guess at what MKL runs
# on AMD ones, which did not reproduce the TOFU-20 study's AMD target on an Intel Xeon: results §24)
KNOWN: tuple[dict[str, str], ...] = ({}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"})


def fingerprint() -> str:
    """SHA-256 (hex) of the fine-tune's arithmetic on fixed inputs in this process (see the module's docstring)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def param(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g) * 0.02).requires_grad_()

    x = torch.randn(16 * 192, 576, generator=g)
    norm, up, down, head = param(576), param(1536, 576), param(576, 1536), param(49152, 576)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 + norm)
    y = F.silu(h @ up.T) @ down.T + x
    logits = y[:256] @ head.T
    loss = F.cross_entropy(logits, torch.randint(0, 49152, (256,), generator=g))
    loss.backward()
    params = [norm, up, down, head]
    grads = [p.grad.clone() for p in params]
    torch.optim.AdamW(params, lr=2e-4, weight_decay=0.01).step()
    digest = hashlib.sha256()
    for t in (y, logits, *grads, *params):
        digest.update(t.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform module says where there is none."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe(env: Mapping[str, str]) -> str:
    """The fingerprint in a fresh Python process with `env` added to this one's (MKL reads it when torch loads)."""
    done = subprocess.run([sys.executable, "-c", "from obliviate.sweep.machine import fingerprint; print(fingerprint())"],
                          capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        raise ObliviateError(f"the kernel fingerprint failed with {dict(env) or 'no added variables'}: "
                             f"{done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def _studies(db: str) -> list[Any]:
    return all_studies(f"sqlite:///{db}")


def recorded_kernels(studies: Iterable[Any], key: str = KEY) -> list[dict[str, Any]]:
    """The kernels the studies record under `key` (each fingerprint once, in the order first recorded); [] when none
    does."""
    out: list[dict[str, Any]] = []
    for s in studies:
        out += [k for k in s.user_attrs.get(key) or [] if k["fingerprint"] not in {o["fingerprint"] for o in out}]
    return out


def _described(rec: Iterable[Mapping[str, Any]]) -> str:
    return "; ".join(f"{r.get('cpu', '?')}, fingerprint {r['fingerprint'][:12]}" for r in rec) or "not recorded"


def env_lines(*dbs: str) -> str:
    """`export` lines for the environment (of KNOWN) whose fingerprint is one the studies at `dbs` record (a study
    and the one whose target it shares); empty when they record none or when this environment is it; an
    ObliviateError when none matches."""
    db = ", ".join(dbs)
    studies = [s for d in dict.fromkeys(dbs) if Path(d).is_file() for s in _studies(d)]
    rec, other = recorded_kernels(studies), recorded_kernels(studies, OTHER)
    if not rec and not other:
        return ""
    good, bad = {r["fingerprint"] for r in rec}, {o["fingerprint"] for o in other}
    seen = []
    for env in KNOWN:  # native first; each probed once
        seen.append(probe(env))
        # with no machine of the study's kind recorded yet, a setting not seen giving other weights may
        if (seen[-1] in good) if good else (seen[-1] not in bad):
            return "".join(f"export {k}={v}\n" for k, v in env.items())
    there = (f"there: {_described(rec)}" if rec else
             f"every known setting here was seen fine-tuning other weights: {_described(other)}")
    raise ObliviateError(
        f"this machine's CPU kernels round differently from those the study in {db} was made with ({there}; "
        f"here: {cpu_name()}, {seen[0][:12]} natively, and no other known setting gives theirs): its fine-tunes "
        "would give other weights, which the workers refuse; run it on a machine of the study's kind, or start "
        "a new study (another STUDY_DIR)")


def record(db: str, target: str) -> str:
    """Check the target's weights against those the study at `db` records (when it does) and record this machine's
    kernels in each of its studies that lacks them; a line saying what was done. An ObliviateError when the weights
    differ (the fine-tune here gave others), after recording these kernels with the digest they gave under OTHER."""

    if not Path(db).is_file():
        return f"no study in {db} yet: its first worker records the models, a later run the kernels"
    studies = _studies(db)
    digest = model_digest(load_model(target))  # as the workers take it
    made = _made_with(studies, "original")
    kernels = {"fingerprint": fingerprint(), "cpu": cpu_name(),
               "env": {k: os.environ[k] for env in KNOWN for k in env if k in os.environ}}
    if made and digest not in made:
        _add(studies, OTHER, {**kernels, "weights": digest})
        raise ObliviateError(
            f"{target}'s weights ({digest[:12]}) are not those the study in {db} was made with "
            f"({', '.join(sorted(d[:12] for d in made))}): this machine ({cpu_name()}, kernel fingerprint "
            f"{kernels['fingerprint'][:12]}) fine-tunes other weights than the study's (kernels there: "
            f"{_described(recorded_kernels(studies))}); the workers would refuse them: run it on a machine of the "
            "study's kind, or start a new study (another STUDY_DIR). These kernels are recorded as such, so that "
            "the next machine like this one stops before its fine-tunes")
    added = _add(studies, KEY, kernels)
    what = f"recorded in {added} studies" if added else "recorded already"
    return f"kernels {kernels['fingerprint'][:12]} ({kernels['cpu']}, {json.dumps(kernels['env'])}): {what}"


def check_retain(db: str, retain: str) -> str:
    """Check a retain model's weights against those the study at `db` measured its trials against (the digest its
    first worker recorded); a line saying so. An ObliviateError when they differ or the study records none, so an
    audit whose 0% reference is that model (scripts/tofu20_audits.sh REF0=retain) never runs against another."""
    if not Path(db).is_file():
        raise ObliviateError(f"no study in {db}: there is no retain model to check {retain} against; run the "
                             "script from the repository root, where the committed snapshot is")
    made = _made_with(_studies(db), "retain")
    if not made:
        raise ObliviateError(f"the study in {db} records no retain model's weights (its workers record them with "
                             f"their first trial): {retain} cannot be checked; audit against the unlearned model "
                             "(REF0=unlearned) or run the study first")
    digest = model_digest(load_model(retain))  # as the workers take it
    if digest not in made:
        raise ObliviateError(
            f"{retain}'s weights ({digest[:12]}) are not the retain model the study in {db} was measured against "
            f"({', '.join(sorted(d[:12] for d in made))}): this machine fine-tuned other weights (run the audits on "
            "a machine of the study's kind), or the folder holds another model (move it aside and run again to "
            "fine-tune it)")
    return f"{retain}: the study's retain model ({digest[:12]})"


def _made_with(studies: Iterable[Any], which: str) -> set[str]:
    """The weight digests of model `which` ("original", "retain") the studies' workers recorded."""
    return {(s.user_attrs.get("models") or {}).get(which) for s in studies} - {None}


def _add(studies: Iterable[Any], key: str, kernels: Mapping[str, Any]) -> int:
    """Append `kernels` to `key` in each study that lacks its fingerprint; how many did."""
    missing = [s for s in studies
               if kernels["fingerprint"] not in {k["fingerprint"] for k in s.user_attrs.get(key) or []}]
    for s in missing:
        s.set_user_attr(key, [*(s.user_attrs.get(key) or []), dict(kernels)])
    return len(missing)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m obliviate.sweep.machine env STUDY.db [MORE.db ...] | record STUDY.db TARGET_DIR"
             " | retain STUDY.db RETAIN_DIR")
    if not args or not ((args[0] == "env" and len(args) >= 2) or (args[0] in ("record", "retain") and len(args) == 3)):
        print(usage, file=sys.stderr)
        return 2
    try:
        if args[0] == "env":
            print(env_lines(*args[1:]), end="")
        elif args[0] == "record":
            print(record(args[1], args[2]))
        else:
            print(check_retain(args[1], args[2]))
    except ObliviateError as exc:
        print(f"obliviate: error: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
