"""The audit on paths (`obliviate audit`, an `audit:` run-config section): load models and data, run, write."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from obliviate.audit.verdict import write_reports
from obliviate.config.audit import AuditConfig
from obliviate.data.rows import QARow
from obliviate.data.splits import load_attack_splits
from obliviate.errors import ConfigError
from obliviate.files import write_json


def load_audit_data(cfg: AuditConfig) -> tuple[list[QARow], list[QARow], list[QARow], list[str]]:
    """(forget, retain, holdout, notes) of an audit (data.splits.load_attack_splits with the audit's split names)."""
    if not cfg.data:
        raise ConfigError("audit needs data: --data DIR (a TOFU-style directory such as obliviate-demo/world)")
    return load_attack_splits(cfg.data, *cfg.split_names())


def _same_vocab(tok: Any, path: str, what: str) -> None:
    from obliviate.modeling.load import load_tokenizer

    if load_tokenizer(path).get_vocab() != tok.get_vocab():
        raise ConfigError(f"the {what} {path!r} has another tokenizer than the unlearned model: the audit compares "
                          "them token by token, so all models must share one tokenizer")


def audit_from_config(cfg: AuditConfig, log: Callable[[str], None] = print) -> Any:
    """Load cfg.model / cfg.original / cfg.retain_model and the data, run the audit, print the verdict, write
    audit.json, report.md and report.html into cfg.output (atomically) when set. -> AuditResult."""
    from obliviate.audit.core import run_audit
    from obliviate.modeling.load import atomic_dir, load_model, load_pretrained

    for key in ("model", "original"):
        if not getattr(cfg, key):
            what = "unlearned" if key == "model" else "pre-unlearning"
            raise ConfigError(f"audit needs --{key} DIR (the {what} model)")
    if cfg.output:  # refuse an existing output before minutes of work
        from obliviate.modeling.load import check_output_dir

        check_output_dir(cfg.output, cfg.overwrite, _inputs(cfg))
    forget, retain, holdout, notes = load_audit_data(cfg)
    model, tok = load_pretrained(cfg.model)
    _same_vocab(tok, cfg.original, "original model")
    original = load_model(cfg.original)
    retain_model = None
    if cfg.retain_model:
        _same_vocab(tok, cfg.retain_model, "retain model")
        retain_model = load_model(cfg.retain_model)
    res = run_audit(model, original, tok, forget, retain_rows=retain, holdout=holdout, retain_model=retain_model,
                    cfg=cfg, log=log)
    res.notes[:0] = notes
    log(res.table())
    for n in res.notes:
        log(f"note: {n}")
    if cfg.output:
        with atomic_dir(cfg.output, cfg.overwrite, _inputs(cfg)) as out:
            write_audit(out, res, cfg, model=cfg.model, original=cfg.original, retain_model=cfg.retain_model,
                        data=cfg.data)
        log(f"audit: {Path(cfg.output) / 'audit.json'}, report.md, report.html ({res.seconds:.0f} s)")
    return res


def write_audit(out: Path, res: Any, cfg: AuditConfig, **where: str | None) -> None:
    """audit.json (everything, raw shares, what was audited: `where`) and report.md / report.html into `out`."""

    data = res.to_json() | dict(where) | {"splits": load_names(cfg)}
    write_json(out / "audit.json", data)
    write_reports(out, data, res.rows)


def load_names(cfg: AuditConfig) -> dict[str, str | None]:
    """The forget / retain / holdout split names the audit reads."""
    return dict(zip(("forget", "retain", "holdout"), cfg.split_names()))


def _inputs(cfg: AuditConfig) -> dict[str, Any]:
    return {"model": cfg.model, "original": cfg.original, "retain_model": cfg.retain_model, "data": cfg.data}


def audit_run_output(cfg: AuditConfig, output_dir: str, original: str, data: str, forget_split: str,
                     log: Callable[[str], None] = print) -> Any:
    """A run's own audit (an `audit:` section with enabled: true): the saved model in `output_dir` against
    `original`, on the run's data and forget split (unless the section names others); results in
    output_dir/audit unless audit.output is set."""
    import dataclasses

    filled = dataclasses.replace(cfg, model=cfg.model or output_dir, original=cfg.original or original,
                                 data=cfg.data or data, forget_split=cfg.forget_split or forget_split,
                                 output=cfg.output or str(Path(output_dir) / "audit"))
    return audit_from_config(filled, log)
