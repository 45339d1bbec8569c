"""The authors' own loss and gradient-rule functions against obliviate's, on identical tensors (a loss-level oracle).

    python benchmarks/authors_oracle.py --asu PATH/TO/ASU-unlearning --sago PATH/TO/SAGO [--seed 0]

Loaded by file path from local copies of the authors' repositories (nothing of theirs is copied into obliviate):
- ASU (Salehzz/ASU-unlearning, Right-to-be-forgotten/trainer/losses.py): `asu_loss`; both `kl_loss` definitions
  (the first, masked one is shadowed by the second in Python, so it is compiled alone from the file's syntax tree);
  their functions take models, so each gets a stand-in whose forward returns the given logits.
- SAGO (sustech-nlp/SAGO, src/trainer/unlearn/grad_surgery.py): the rule methods of `GradSurgeryMixin`
  (sago, sago_prefer_retain, pcgrad, pcgrad_global, blur, sum). The module imports deepspeed and its package
  relatively, so the class is compiled alone from the syntax tree with torch in scope; its methods touch only
  alpha, gamma and the strategy name.
Against: obliviate's `asu` forget objective (per-example reduction), the `kl` retain term on answer tokens
("example" reduction: the first kl_loss) and over every position of rows padded to max_length ("token": the
second, released kl_loss), and the gradient rules of obliviate.gradients. Everything in float64; each row prints
the largest absolute difference over several random draws; the exit status is 1 if any exceeds 1e-6.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch
import torch.nn.functional as F

from obliviate.gradients import RULES
from obliviate.modeling.logprobs import IGNORE_INDEX, position_labels, token_stats
from obliviate.objectives import FORGET, RETAIN

TOLERANCE = 1e-6


def load_module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def first_definition(path: Path, name: str, scope: dict[str, Any]) -> Callable[..., Any]:
    """The FIRST `def name` of a file, compiled alone (a later definition of the same name shadows it on import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = dict(scope)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def lifted_class(path: Path, name: str) -> type:
    """Class `name` of a file compiled alone with torch, typing and re in scope (its module's imports skipped)."""
    import re
    import typing

    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    namespace: dict[str, Any] = {"torch": torch, "nn": torch.nn, "F": F, "re": re,
                                 **{k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Tuple",
                                                                     "Union", "Callable")}}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


class Fixed:
    """A stand-in model: its forward returns the given logits (and a loss the authors' code only prints)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def __call__(self, *args: Any, **kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits, loss=torch.zeros((), dtype=self.logits.dtype))


def draw_batch(g: torch.Generator, B: int = 3, T: int = 12, V: int = 11) -> dict[str, torch.Tensor]:
    """Right-padded rows: a prompt of 2-4 tokens (labels -100), an answer of 3+ tokens, padding (labels -100)."""
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = torch.full((B, T), IGNORE_INDEX)
    att = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        prompt = int(torch.randint(2, 5, (1,), generator=g))
        length = int(torch.randint(prompt + 3, T + 1, (1,), generator=g))
        att[b, :length] = 1
        labels[b, prompt:length] = ids[b, prompt:length]
    return {"input_ids": ids, "attention_mask": att, "labels": labels,
            "student": torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3,
            "reference": torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3}


def loss_rows(asu_root: Path, draws: int, seed: int) -> list[tuple[str, float]]:
    path = asu_root / "Right-to-be-forgotten" / "trainer" / "losses.py"
    theirs = load_module(path, "asu_authors_losses")
    first_kl = first_definition(path, "kl_loss", vars(theirs))
    g = torch.Generator().manual_seed(seed)
    worst = {"asu_loss vs forget asu (example)": 0.0, "kl_loss #1 (line 161) vs kl answer (example)": 0.0,
             "kl_loss #2 (line 197, released) vs kl max_length (token)": 0.0}
    for _ in range(draws):
        d = draw_batch(g)
        inputs = [(d["input_ids"], d["labels"], d["attention_mask"])] * 2
        student, reference = Fixed(d["student"]), Fixed(d["reference"])
        policy, ref = token_stats(d["student"], d["labels"]), token_stats(d["reference"], d["labels"])
        pairs = [
            (theirs.asu_loss(student, reference, inputs, attention_temp=2.0, layers_id=None),
             FORGET.get("asu").fn(policy, teacher=ref, reduction="example")),
            (first_kl(student, reference, inputs), RETAIN.get("kl").fn(policy, reference=ref, reduction="example")),
        ]
        # The released term: every position of the padded rows. obliviate relabels the batch (positions max_length,
        # the last logit counted by one more column) and runs the same KL over the counted positions.
        T, V = d["student"].shape[1:]
        batch = position_labels({k: d[k] for k in ("input_ids", "attention_mask", "labels")}, "max_length", pad=0,
                                vocab_size=V, max_length=T, last=True)
        extra = torch.zeros(d["student"].shape[0], 1, V, dtype=torch.float64)
        wide = [token_stats(torch.cat([d[k], extra], 1), batch["labels"]) for k in ("student", "reference")]
        pairs.append((theirs.kl_loss(student, reference, inputs),
                      RETAIN.get("kl").fn(wide[0], reference=wide[1], reduction="token")))
        for key, (a, b) in zip(worst, pairs):
            worst[key] = max(worst[key], abs(float(a) - float(b)))
    return list(worst.items())


def draw_grads(g: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Forget and retain gradients of five tensors of different shapes; some pairs conflict as a whole, some not."""
    shapes = [(4, 3), (7,), (2, 2, 3), (5,), (3, 4)]
    f = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    r = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    r[0] = -f[0] + 0.3 * r[0]  # a conflicting tensor: PCGrad projects it
    r[1] = f[1] + 0.3 * r[1]  # an agreeing one: left alone
    return f, r


# Differences above float64 rounding, explained: SAGO's `_dot_product` (grad_surgery.py:214-220) adds the per-tensor
# sums into a float32 scalar, so the global dot product and squared norm of pcgrad_global and blur are rounded to
# float32 (relative 6e-8) before the coefficient is formed; obliviate keeps the gradients' own dtype.
NOTES = {"pcgrad_global vs rule pcgrad_global": "their global sums are float32 (grad_surgery.py:214-220)",
         "blur vs rule blur": "their global sums are float32 (grad_surgery.py:214-220)"}
RULE_PAIRS = {"sago": "sago", "sago_prefer_retain": "sago_retain", "pcgrad": "pcgrad",
              "pcgrad_global": "pcgrad_global", "blur": "blur", "sum": "sum"}


def rule_rows(sago_root: Path, draws: int, seed: int) -> list[tuple[str, float]]:
    mixin = lifted_class(sago_root / "src" / "trainer" / "unlearn" / "grad_surgery.py", "GradSurgeryMixin")
    g = torch.Generator().manual_seed(seed + 1)
    worst = {f"{theirs} vs rule {ours}": 0.0 for theirs, ours in RULE_PAIRS.items()}
    for i in range(draws):
        alpha, gamma = (0.5, 1.0) if i % 2 else (1.0, 0.1)  # SAGO's GradDiff_sago_bio and NPO_sago_bio weights
        f, r = draw_grads(g)
        for (theirs, ours), key in zip(RULE_PAIRS.items(), worst):
            m = mixin()
            m.alpha, m.gamma, m.surgery_strategy = alpha, gamma, theirs
            a = m._combine_grads([t.clone() for t in f], [t.clone() for t in r])
            b = RULES.get(ours).fn([t.clone() for t in f], [t.clone() for t in r], alpha=alpha, gamma=gamma)
            worst[key] = max(worst[key], max(float((x - y).abs().max()) for x, y in zip(a, b)))
    return list(worst.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--asu", type=Path, required=True, help="a local copy of Salehzz/ASU-unlearning")
    ap.add_argument("--sago", type=Path, required=True, help="a local copy of sustech-nlp/SAGO")
    ap.add_argument("--draws", type=int, default=20, help="random draws per function (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for root, marker in ((args.asu, "Right-to-be-forgotten/trainer/losses.py"),
                         (args.sago, "src/trainer/unlearn/grad_surgery.py")):
        if not (root / marker).is_file():
            ap.error(f"{root} has no {marker}: pass the repository's top folder")
    rows = loss_rows(args.asu, args.draws, args.seed) + rule_rows(args.sago, args.draws, args.seed)
    width = max(len(k) for k, _ in rows)
    print(f"{'authors function vs obliviate':<{width}}  max |difference| over {args.draws} draws (float64)")
    for key, diff in rows:
        note = f"  ({NOTES[key]})" if key in NOTES and diff > 1e-12 else ""
        print(f"{key:<{width}}  {diff:.2e}{'' if diff <= TOLERANCE else '  > 1e-6'}{note}")
    bad = [k for k, d in rows if d > TOLERANCE]
    print("all equal to <= 1e-6" if not bad else f"{len(bad)} above 1e-6: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
