"""The model card (README.md) written beside an unlearned model: what was forgotten, how, how it was measured.

The card is a Hugging Face model card: YAML metadata that the Hub (and `huggingface_hub.ModelCard`) reads, then the
Markdown body. The metadata says only what is known (docs/DESIGN.md §3, "nothing invented"): base model and licence
are the starting model's (its hub id, or what its own card says), the datasets are hub ids, the evaluation results
are the run's own registered metrics as `model-index` entries, and the `obliviate` key carries the receipt's digests.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from obliviate import hub
from obliviate.data.rows import builtin_dir
from obliviate.eval.metrics import metric_infos, metrics_markdown
from obliviate.modeling.gguf import ALIASES, is_gguf_source
from obliviate.modeling.sources import hub_cached_file

TASK = "text-generation"
TAGS = ("unlearning", "obliviate")
DATASET_HUB_IDS = {"tofu": "locuslab/TOFU"}  # data sources shipped with obliviate -> the hub id they copy
# metric-name prefix -> the eval.* key of the split it is measured on (the dataset config of its model-index entry)
SPLIT_OF_PREFIX = (("forget_", "forget_split"), ("retain_", "retain_split"), ("real_authors_", "real_authors_split"),
                   ("world_facts_", "world_facts_split"))


@dataclass(frozen=True)
class BaseFacts:
    """What the starting model says about itself: the base model and licence to declare, and where they came from."""

    base_model: str | list[str] | None
    license: str | None
    note: str  # one sentence for the card body: where base_model and license come from, or why they are missing


def _is_hub_id(text: str) -> bool:
    """A hub id ("owner/name" or "name") that is no local path."""
    return hub.looks_like_repo_id(text) and not Path(text).expanduser().exists()


def _own_card(readme: Path | str | None) -> tuple[Any, Any]:
    """(base_model, license) from a model's README.md front matter; (None, None) when it has none or is unreadable."""
    if readme is None or not Path(readme).is_file():
        return None, None
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(readme, ignore_metadata_errors=True).data
    except Exception:  # a README without (valid) front matter: nothing declared
        return None, None
    return data.base_model or None, data.license or None


def _config_license(config: Path | str | None) -> str | None:
    """The `license` key of a config.json, if any."""
    try:
        value = json.loads(Path(config).read_text(encoding="utf-8")).get("license") if config else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def base_facts(source: str) -> BaseFacts:
    """The base model and licence the card of a model unlearned from `source` (model.path) declares.

    A hub id is the base model itself, its licence read from its card or config.json in the hub cache (no network);
    a local directory declares what its own card (README.md front matter) says, else nothing; a GGUF file or alias
    declares nothing."""
    source = str(source)
    path = Path(source).expanduser()
    if path.is_dir():
        base, lic = _own_card(path / "README.md")
        lic = lic or _config_license(path / "config.json")
        where = f"the starting model `{source}` is a local directory"
        note = (f"{where}; base model `{base}` as its own card declares it" if base else
                f"{where} whose card names no base model, so this card declares none")
    elif _is_hub_id(source) and not is_gguf_source(source):
        base = source
        _, lic = _own_card(hub_cached_file(source, "README.md"))
        lic = lic or _config_license(hub_cached_file(source, "config.json"))
        note = f"base model `{source}`: the starting model (model.path, a hub id)"
    elif source in ALIASES and ALIASES[source].base_model:
        alias = ALIASES[source]
        base, lic = alias.base_model, alias.license
        note = (f"base model `{base}`: the starting model `{source}` is its GGUF quantisation `{alias.filename}` "
                f"(from `{alias.install}`), dequantised to float32")
    else:
        base, lic = None, None
        note = f"the starting model `{source}` is a GGUF file or alias, not a hub id: this card declares no base model"
    lic_note = (f"licence `{lic}` carried over from the starting model" if lic else
                "licence unknown (the starting model declares none): none is declared here; check the base "
                "model's terms before sharing")
    return BaseFacts(base, lic, f"{note}; {lic_note}.")


def dataset_id(source: str | None) -> str | None:
    """The hub id of a data source: a shipped copy (`tofu`, or its folder) -> the id it copies, a hub id as it is,
    any other local path -> None."""
    if not source:
        return None
    source = str(source)
    for name, repo in DATASET_HUB_IDS.items():
        if source == name or (Path(source).expanduser().is_dir()
                              and Path(source).expanduser().resolve() == builtin_dir(name).resolve()):
            return repo
    return source if _is_hub_id(source) and "/" in source else None


def _eval_source(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(the evaluation's data source, its eval.* section or None for MUSE) of a resolved run config."""
    data = config.get("data") or {}
    if data.get("format", "qa") == "qa":
        return (config.get("eval") or {}).get("source") or data.get("source"), "eval"
    return (config.get("muse") or {}).get("source") or None, None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def eval_results(receipt: Mapping[str, Any], after: Mapping[str, Any] | None) -> list[Any]:
    """`huggingface_hub.EvalResult`s of the run's registered metrics (metric_type = the metric's name), each on the
    split it is measured on; metrics that are null, not finite or not registered (counts, notes) are left out."""
    if not after:
        return []
    from huggingface_hub import EvalResult

    config = receipt["config"]
    source, section = _eval_source(config)
    if not source:
        return []
    repo = dataset_id(source)
    name = Path(str(source)).name if repo is None else repo.split("/")[-1]
    ev = (config.get(section) or {}) if section else {}
    args = {"max_examples": ev["max_examples"]} if ev.get("max_examples") else None
    infos, out = metric_infos(), []
    for metric, value in after.items():
        if metric not in infos or not _number(value):
            continue
        key = next((k for prefix, k in SPLIT_OF_PREFIX if metric.startswith(prefix)), None)
        out.append(EvalResult(task_type=TASK, dataset_type=repo or name,
                              dataset_name=name if repo else f"{name} (local data)",
                              dataset_config=ev.get(key) if key else None, dataset_args=args,
                              metric_type=metric, metric_name=metric, metric_value=value))
    return out


def digests(receipt: Mapping[str, Any]) -> dict[str, Any]:
    """The receipt's digests for the card's metadata (key `obliviate`): weights before/after, the data rows."""
    w, data = receipt["weights"], receipt["data"]
    return {"obliviate_version": receipt["obliviate_version"], "receipt": "receipt.json",
            "receipt_version": receipt["receipt_version"], "method": receipt["method"]["label"],
            "final_weights_sha256": w["final"]["sha256"], "start_weights_sha256": w["start"]["sha256"],
            "forget_rows_sha256": data["forget"]["sha256"], "retain_rows_sha256": data["retain"]["sha256"]}


def card_data(receipt: Mapping[str, Any], after: Mapping[str, Any] | None, base: BaseFacts | None = None) -> Any:
    """The card's metadata as a `huggingface_hub.ModelCardData`."""
    from huggingface_hub import ModelCardData

    config = receipt["config"]
    base = base or base_facts(receipt["weights"]["start"]["source"])
    sources = [(config.get("data") or {}).get("source"), _eval_source(config)[0]]
    datasets = list(dict.fromkeys(d for d in map(dataset_id, sources) if d))
    method = receipt["method"]
    tags = list(dict.fromkeys([*TAGS, method["label"], method["forget"]]))
    lora = (config.get("model") or {}).get("lora") or {}
    results = eval_results(receipt, after)
    adapters_only = lora.get("enabled") and not lora.get("merge_on_save")
    return ModelCardData(base_model=base.base_model, datasets=datasets or None, tags=tags, license=base.license,
                         library_name="peft" if adapters_only else "transformers",
                         pipeline_tag=TASK, model_name=Path(str(config.get("output_dir") or method["label"])).name,
                         eval_results=results or None, obliviate=digests(receipt))


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

    table = metrics_markdown(after, title="after").splitlines()[2:]  # drop the title
    return ["Metrics of the unlearned model (the run's own evaluation; the starting model was not "
            "evaluated by this run). Definitions: the `meaning` column and the project's docs/METRICS.md.", ""] + table


def _share(row: Any) -> str:
    """An attack's recovered share as the card prints it ('n/a' when the audit could not compute one)."""
    share = row.get("share") if isinstance(row, Mapping) else None
    return f"{share:.2f}" if _number(share) else "n/a"


def _audit_line(receipt: Mapping[str, Any]) -> str:
    """The card's word on the audit: its verdict, or that it runs after the card is written, or that none ran."""
    verdict = (receipt.get("audit") or {}).get("verdict")
    if isinstance(verdict, Mapping):
        shares = ", ".join(f"{attack} {_share(row)}" for attack, row in verdict.items())
        return f"share of the forgotten knowledge each attack brought back: {shares} (receipt.json `audit`)"
    if receipt.get("audit"):
        return "see receipt.json (`audit`)"
    if ((receipt["config"].get("audit") or {}).get("enabled")):
        return "run after this card was written (audit.enabled); its verdict is in receipt.json (`audit`)"
    return "not run"


def _metadata_lines(meta: Any, base: BaseFacts) -> list[str]:
    """The 'Card metadata' section: where each metadata value comes from."""
    n = len(meta.eval_results or [])
    return ["## Card metadata", "",
            f"- {base.note}",
            f"- datasets: {', '.join(f'`{d}`' for d in meta.datasets)}" if meta.datasets else
            "- datasets: none declared (the data is local, not a hub dataset)",
            f"- tags: {', '.join(f'`{t}`' for t in meta.tags)}",
            f"- evaluation results (`model-index`): {n} registered metrics of the run's own evaluation" if n else
            "- evaluation results: none (no evaluation, or no data source to name)",
            "- `obliviate`: the receipt's digests (weights before and after, forget and retain rows)"]


def model_card(receipt: Mapping[str, Any], examples: Sequence[str], after: Mapping[str, Any] | None,
               base: BaseFacts | None = None) -> str:
    """The README.md of an unlearn output directory, from its receipt (and the full after-metrics): YAML metadata
    (`card_data`; `base` defaults to what the starting model says, `base_facts`), then the Markdown body."""
    base = base or base_facts(receipt["weights"]["start"]["source"])
    meta = card_data(receipt, after, base)
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
    lines += [""] + _metadata_lines(meta, base)
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
              f"- audit: {_audit_line(receipt)}", "",
              "Verify with:", "", "```bash", "obliviate verify receipt.json <dir>",
              f"obliviate verify receipt.json <dir> --data {data['source']}   # also the forget/retain rows", "```", ""]
    return f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(lines)
