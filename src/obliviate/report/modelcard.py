"""The model card (README.md) written beside an unlearned model: what was forgotten, how, how it was measured."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def _steps(train: Mapping[str, Any], done: int) -> str:
    """Optimizer steps run, and what decided them."""
    why = f"train.max_steps={train['max_steps']}" if train.get("max_steps") else f"train.epochs={train.get('epochs')}"
    return f"{done} ({why})"


def _how(receipt: Mapping[str, Any]) -> list[str]:
    """Rows of the 'How' table."""
    cfg, m = receipt["config"], receipt["config"]["method"]
    resolved = receipt["method"].get("resolved") or {}
    train, lora = cfg["train"], cfg["model"].get("lora") or {}
    rows = [("method", f"`{receipt['method']['label']}`"),
            ("forget objective", f"`{m['forget']}` {resolved.get('forget_args', m.get('forget_args')) or ''}".rstrip()),
            ("retain term", f"`{m['retain']}` {resolved.get('retain_args', m.get('retain_args')) or ''}".rstrip()
             if m.get("retain") else "none"),
            ("gradient rule", f"`{m['combine']['rule']}`"), ("weights γ (forget) / α (retain)", f"{m['gamma']} / {m['alpha']}")]
    if m["forget"] == "asu":
        args = resolved.get("forget_args", m.get("forget_args")) or {}
        rows.append(("ASU τ / layers", f"{args.get('tau', 'default')} / {args.get('layers', 'all (default)')}"))
    rows += [("steps", _steps(train, receipt["metrics"]["steps"])), ("learning rate", str(train["lr"])),
             ("batch size × grad accum", f"{train['batch_size']} × {train['grad_accum']}"),
             ("scheduler / weight decay", f"{train['scheduler']} / {train['weight_decay']}"),
             ("seeds", ", ".join(f"{k}={v}" for k, v in receipt["seeds"].items()) or "none")]
    if lora.get("enabled"):
        rows.append(("LoRA", f"r={lora.get('r')}, alpha={lora.get('alpha')}, merged on save: {lora.get('merge_on_save')}"))
    if (cfg.get("continual") or {}).get("enabled"):
        rows.append(("continual", f"{cfg['continual'].get('requests')} requests"))
    return ["| setting | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]


def _measured(after: Mapping[str, Any] | None) -> list[str]:
    """The after-metrics table with each metric's direction, version and definition, or why there is none."""
    if not after:
        return ["Not evaluated (eval.enabled=false, or no evaluation data for this format)."]
    from obliviate.report.markdown import metrics_markdown

    table = metrics_markdown(after, title="after").splitlines()[2:]  # drop the title
    return ["Metrics of the unlearned model (the run's own evaluation; the starting model was not "
            "evaluated by this run). Definitions: the `meaning` column and the project's docs/METRICS.md.", ""] + table


def model_card(receipt: Mapping[str, Any], examples: Sequence[str], after: Mapping[str, Any] | None) -> str:
    """The README.md of an unlearn output directory, from its receipt (and the full after-metrics)."""
    data, w = receipt["data"], receipt["weights"]
    forget, retain, tok = data["forget"], data["retain"], data["tokenization"]
    unit = "rows" if data["format"] == "qa" else "documents"
    lines = [f"# {receipt['method']['label']}: `{w['start']['source']}` with `{forget['split']}` unlearned", "",
             f"Made by obliviate {receipt['obliviate_version']} on {receipt['created']}. Every digest below is in "
             "`receipt.json`, with the resolved config and package versions.", "",
             "## What was unlearned", "",
             f"- forget split `{forget['split']}` of `{data['source']}`: {forget['n_rows']} {unit}",
             f"- retain split `{retain['split']}` (kept): {retain['n_rows']} {unit}",
             "- example forget " + ("questions:" if unit == "rows" else "documents:")]
    lines += [f"  - {' '.join(str(q).split())[:160]}" for q in examples]
    lines += ["", "## How", ""] + _how(receipt)
    lines += ["", "## How it was measured", ""] + _measured(after)
    lines += ["", "## Provenance", "",
              f"- starting weights θ0: `{w['start']['source']}` ({w['start']['dtype']}), {w['start']['n_tensors']} "
              f"tensors, sha256 `{w['start']['sha256']}`",
              f"- final weights: {w['final']['n_tensors']} tensors, sha256 `{w['final']['sha256']}` "
              + (f"({len(w['changed'])} tensors changed from θ0)" if w.get("changed") is not None
                 else "(LoRA adapters only: compare with θ0 after merging them)"),
              f"- forget rows sha256 `{forget['sha256']}`; retain rows sha256 `{retain['sha256']}`",
              f"- tokenisation: max_length {tok['max_length']}, chat template "
              f"{'used' if tok['chat_template'] else 'not used'}, vocabulary {tok['vocab_size']} "
              f"(sha256 `{tok['vocab_sha256'][:16]}…`)",
              f"- audit: {'see receipt.json' if receipt.get('audit') else 'not run'}", "",
              "Verify with:", "", "```bash", "obliviate verify receipt.json <dir>",
              f"obliviate verify receipt.json <dir> --data {data['source']}   # also the forget/retain rows", "```", ""]
    return "\n".join(lines)
