"""`obliviate reproduce`: run the presets behind a published table again (on a GPU as written, or their CPU twins),
resume where it stopped, and write our numbers beside the published ones with the difference.

Each row is one preset run exactly as `obliviate unlearn --config <preset>` runs it (plus the overrides given), into
<out>/<row>; a row whose metrics.json exists is done and is read, not run again, so an interrupted reproduction
continues where it stopped. Before anything trains the plan is printed: each row's optimizer steps and an estimate
of its memory (weights, gradients, optimizer state and a frozen θ0 copy, from the model's config.json); after each
row, its time and the estimated time left. <out>/reproduce.md and reproduce.json are rewritten after every row.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

from obliviate import files, hub
from obliviate.cli.eval import run_eval
from obliviate.cli.unlearn import run_unlearn
from obliviate.config import EvalRunConfig, RunConfig, load_config
from obliviate.errors import ConfigError, ObliviateError
from obliviate.modeling.sources import model_config
from obliviate.preflight import device_checks_skipped, preflight_unlearn, without_device_checks
from obliviate.published import TABLES, Table

HELP = ("run the presets behind a published table again (GPU presets, or --twins on a CPU), resuming where it "
        "stopped, and write our numbers beside the published ones")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", help=f"the table: {', '.join(TABLES)}")
    p.add_argument("--twins", action="store_true",
                   help="run the CPU twins (configs/twins/<family>/): the same recipes on the tiny TOFU target")
    p.add_argument("--out", help="where each row's run and the table go (default: runs/reproduce-<table>[-twins])")
    p.add_argument("--rows", help="comma-separated rows to run (default: every row of the table)")
    p.add_argument("--plan", action="store_true", help="print the plan (rows, steps, memory estimates) and stop")
    p.add_argument("--keep-models", action="store_true",
                   help="keep each row's model weights (default: removed once its metrics are written, to save disk)")
    p.add_argument("overrides", nargs="*", help="key=value settings for every row, right after the table, e.g. "
                                                "`obliviate reproduce tofu-llama32-1b train.max_steps=2 --twins`")


def table_of(name: str) -> Table:
    if name not in TABLES:
        raise ConfigError(f"unknown table {name!r}; valid: {', '.join(TABLES)}")
    return TABLES[name]


def chosen_rows(table: Table, rows: str | None) -> list[str]:
    """The rows asked for (all by default), in the table's order; an unknown name lists the valid ones."""
    if not rows:
        return list(table.rows)
    asked = [r.strip() for r in rows.split(",") if r.strip()]
    unknown = [r for r in asked if r not in table.rows]
    if unknown or not asked:
        raise ConfigError(f"--rows {rows!r}: {', '.join(unknown) or 'no row'} not in {table.name}; valid: "
                          f"{', '.join(table.rows)}")
    return [r for r in table.rows if r in asked]


def parameter_count(config: dict | None) -> int | None:
    """Parameters of a Llama-style decoder from its config.json (attention, MLP, norms, embeddings, head), or None
    when a field is missing. Q/O: hidden × heads·head_dim, K/V: hidden × kv_heads·head_dim, MLP: 3 × hidden ×
    intermediate, two norms per layer, the final norm, the embedding and (untied) the LM head."""
    try:
        h, layers, inter, vocab = (int(config[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                            "vocab_size"))
        heads = int(config["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    kv = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or h // heads)
    per_layer = 2 * h * heads * head_dim + 2 * h * kv * head_dim + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    return layers * per_layer + h + vocab * h + head


def model_json(path: str) -> dict | None:
    """The model's config.json: local or in the hub cache, else that one small file from the hub when it answers."""

    found = model_config(path)
    if found is not None or hub.skipping() or hub.offline() or not hub.looks_like_repo_id(path) or hub.unreachable():
        return found
    import json

    from huggingface_hub import hf_hub_download

    try:
        return json.loads(Path(hf_hub_download(path, "config.json")).read_text(encoding="utf-8"))
    except Exception:  # a gated or missing repository: the estimate is left out, the run itself says why
        return None


def memory_estimate(cfg: Any, frozen_copy: bool) -> str:
    """Device memory of a run's weights, gradients, optimizer state and frozen θ0 copy from its model's config.json
    (an estimate, not a measurement; activations come on top)."""
    n = parameter_count(model_json(cfg.model.path))
    if n is None:
        return "memory unknown until the model's config.json can be read"
    width = 4 if cfg.model.dtype == "float32" else 2
    state = {"adamw": 2 * width, "paged_adamw": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2}[cfg.train.optimizer]
    per_param = 2 * width + state + (width if frozen_copy and not cfg.model.lora.enabled else 0)
    size = f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.1f}M"
    memory = n * per_param / 1e9
    amount = f"{memory:.1f} GB" if memory >= 1 else f"{memory * 1e3:.0f} MB"
    return f"{size} parameters: ~{amount} + activations (estimate)"


def plan_row(table: Table, row: str, twins: bool, out: Path, overrides: list[str]) -> tuple[Any, list[str]]:
    """(config, plan line) of one row: its preset with the overrides and output_dir <out>/<row>, checked by the
    unlearn pre-flight (a row already run is read, not checked or written again)."""

    path = Path(table.folder(twins)) / f"{row}.yaml"
    if not path.is_file():
        raise ConfigError(f"{path} not found: run obliviate reproduce from the repository root (where configs/ is)")
    cfg = load_config(RunConfig, path, [*overrides, f"output_dir={out / row}"])
    if row_done(table, out / row):
        return cfg, f"{row}: done earlier, read from {out / row}"
    if (out / row / "metrics.json").is_file():
        return cfg, f"{row}: trained earlier in {out / row}; its evaluations are left" + evals_line(table)
    plan = preflight_unlearn(cfg, need_output=False)
    steps = next((ln.split(":", 1)[1].strip() for ln in plan.lines if ln.startswith("schedule:")), "steps unknown")
    return cfg, f"{row}: {path}; {steps}; {memory_estimate(cfg, plan.method.needs_frozen)}" + evals_line(table)


def evals_line(table: Table) -> str:
    """The plan's note on the evaluations that follow each row's training; refused before anything trains when
    they need lm-evaluation-harness and it is not installed (unless only planning: the plan is for another machine)."""
    import importlib.util

    if not table.evals:
        return ""
    tasks = [t for spec in table.evals for t in load_config(EvalRunConfig, None, spec).mcq.lm_eval_tasks]
    if tasks and importlib.util.find_spec("lm_eval") is None:
        from obliviate.eval.mcq import LM_EVAL_HINT

        if not device_checks_skipped():
            raise ConfigError(f"{table.name} scores its rows with lm-evaluation-harness ({', '.join(tasks)}): "
                              f"{LM_EVAL_HINT}")
        return f"; then {len(table.evals)} evaluations ({', '.join(tasks)}; lm-eval is not installed here)"
    return f"; then {len(table.evals)} evaluations ({', '.join(tasks) or 'native'})"


def eval_dir(run_dir: Path, i: int) -> Path:
    """Where the table's i-th evaluation of a row's model goes: <run_dir>/eval-<i>."""
    return run_dir / f"eval-{i}"


def row_done(table: Table, run_dir: Path) -> bool:
    """A row is done when its run and every evaluation the table asks for have written metrics.json."""
    return all((d / "metrics.json").is_file() for d in [run_dir, *(eval_dir(run_dir, i) for i in
                                                                   range(len(table.evals)))])


def measured(table: Table, run_dir: Path) -> dict[str, Any]:
    """The table's metrics from a finished row's metrics.json and its evaluations' (None where none has it)."""
    import json

    ev: dict[str, Any] = {}
    for d in [run_dir, *(eval_dir(run_dir, i) for i in range(len(table.evals)))]:
        ev.update({k: v for k, v in (json.loads((d / "metrics.json").read_text(encoding="utf-8")).get("eval")
                                     or {}).items() if v is not None})
    return {m: ev.get(m) for m in table.metrics}


def evaluate_row(table: Table, cfg: Any) -> None:
    """The table's evaluations of a trained row's model (`obliviate eval` with each of table.evals), each into
    <run_dir>/eval-<i>; one already written is kept (an interrupted row resumes at its next evaluation)."""

    run_dir = Path(cfg.output_dir)
    for i, spec in enumerate(table.evals):
        if not (eval_dir(run_dir, i) / "metrics.json").is_file():
            run_eval(load_config(EvalRunConfig, None, [*spec, f"model.path={run_dir}", f"model.dtype={cfg.model.dtype}",
                                                       f"output_dir={eval_dir(run_dir, i)}", "overwrite=true"]))


def _cell(x: Any) -> str:
    if x is None:
        return "—"
    return f"{x:.3g}" if isinstance(x, float) and (x == 0 or 1e-3 <= abs(x) < 1e4) else f"{x:.2e}"


def table_markdown(table: Table, results: dict[str, dict[str, Any]], twins: bool) -> str:
    """The table: per row and metric, published | ours | ours − published."""
    head = [f"# {table.title}{' (CPU twins)' if twins else ''}", "",
            f"Published: {table.source}." + (f" {table.note}." if table.note else ""),
            "Ours: `obliviate reproduce " + table.name + (" --twins" if twins else "") + "`"
            + (": the CPU twins run the same recipes on a tiny model, so their numbers are not comparable with the "
               "published ones; they show the pipeline end to end." if twins else "."), ""]
    cols = [f"{m}: published \\| ours \\| Δ" for m in table.metrics]
    lines = ["| row | status | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for row, res in results.items():
        pub = table.published.get(row, {})
        cells = []
        for m in table.metrics:
            p, o = pub.get(m), (res.get("metrics") or {}).get(m)
            diff = o - p if isinstance(o, (int, float)) and isinstance(p, (int, float)) else None
            cells.append(f"{_cell(p)} \\| {_cell(o)} \\| {_cell(diff)}")
        lines.append(f"| {row} | {res['status']} | " + " | ".join(cells) + " |")
    return "\n".join(head + lines) + "\n"


def _drop_weights(run_dir: Path) -> None:
    """Remove a finished row's weight files (its metrics, report, receipt and config stay)."""
    for f in run_dir.glob("*.safetensors"):
        f.unlink()
    for f in run_dir.glob("*.bin"):
        f.unlink()


def run(args: argparse.Namespace) -> int:
    table = table_of(args.table)
    if args.twins and table.twins is None:
        raise ConfigError(f"{table.name} has no CPU twins: {table.twinless}. Run it on a GPU without --twins, or "
                          "print its plan with --plan")
    rows = chosen_rows(table, args.rows)
    out = Path(args.out or f"runs/reproduce-{table.name}{'-twins' if args.twins else ''}")
    from contextlib import ExitStack

    with ExitStack() as stack:
        if args.plan:  # a plan for another machine: no check of this machine's devices, and no hub when none answers
            stack.enter_context(without_device_checks())
            if hub.offline() or hub.unreachable():
                stack.enter_context(hub.skipping_hub())
        planned = [plan_row(table, row, args.twins, out, list(args.overrides)) for row in rows]
    print(f"{table.title}{' (CPU twins)' if args.twins else ''}: {len(rows)} row(s) into {out}; time: measured on the "
          "first row, then the time left after each")
    for _, line in planned:
        print("  " + line)
    if args.plan:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    started, seconds, failed = time.time(), [], 0

    for i, (cfg, _) in enumerate(planned):
        row, run_dir = rows[i], Path(cfg.output_dir)
        if row_done(table, run_dir):
            results[row] = {"status": "done earlier", "metrics": measured(table, run_dir)}
            print(f"[{i + 1}/{len(rows)}] {row}: done earlier, read from {run_dir}")
        else:
            t0 = time.time()
            try:
                if not (run_dir / "metrics.json").is_file():  # trained earlier, stopped in its evaluations
                    run_unlearn(cfg)
                evaluate_row(table, cfg)
                results[row] = {"status": "ran", "metrics": measured(table, run_dir),
                                "seconds": round(time.time() - t0, 1)}
                seconds.append(time.time() - t0)
                if not args.keep_models:
                    _drop_weights(run_dir)
            except ObliviateError as exc:
                failed += 1
                results[row] = {"status": f"failed: {' '.join(str(exc).split())}"}
            left = len(rows) - i - 1
            eta = f"; about {math.ceil(left * sum(seconds) / len(seconds) / 60)} min left" if seconds and left else ""
            print(f"[{i + 1}/{len(rows)}] {row}: {results[row]['status'].split(':')[0]} in "
                  f"{time.time() - t0:.0f} s{eta}", flush=True)
        files.write_json_atomic(out / "reproduce.json", {"table": table.name, "twins": args.twins, "rows": results,
                                                         "published": {r: dict(table.published.get(r, {}))
                                                                       for r in results}})
        tmp = out / f".reproduce.md.{os.getpid()}"
        tmp.write_text(table_markdown(table, results, args.twins), encoding="utf-8")
        os.replace(tmp, out / "reproduce.md")
    print(table_markdown(table, results, args.twins))
    print(f"wrote {out / 'reproduce.md'} and reproduce.json in {time.time() - started:.0f} s"
          + (f"; {failed} row(s) failed (see their status)" if failed else ""))
    return 1 if failed else 0

