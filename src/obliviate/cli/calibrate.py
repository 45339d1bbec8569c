"""`obliviate calibrate`: sweep the attention temperature and layer sets with the smoothed teacher alone and
recommend ASU's τ."""
from __future__ import annotations

import argparse
from typing import Any

from obliviate.cli import configured, runs
from obliviate.config import CalibrateConfig, to_dict
from obliviate.data.rows import load_split
from obliviate.files import write_json
from obliviate.preflight import check_layer_sets, preflight_calibrate
from obliviate.train.student import load_model

HELP = ("sweep attention temperature and layers with the smoothed teacher alone; recommend ASU's tau; with "
        "replies=true, the teacher map: where facts drop while the teacher's replies stay fluent")


add_arguments = configured.add_config_arguments


def run(args: argparse.Namespace) -> int:
    return configured.run_with(run_calibrate, args)


def run_calibrate(cfg: CalibrateConfig) -> dict[str, Any]:
    """Sweep τ and layer sets with the smoothed teacher alone; print and optionally save the table."""
    from obliviate.eval.analysis import calibrate, default_layer_sets, layer_windows
    from obliviate.modeling.load import atomic_dir
    from obliviate.report.markdown import calibration_table
    from obliviate.report.plots import png_bytes, teacher_map_plot

    rows = preflight_calibrate(cfg)
    model, tok = load_model(cfg.model)
    n_layers = runs.model_layers(model) or model.config.num_hidden_layers
    check_layer_sets(cfg.layer_sets, n_layers)
    if cfg.window_widths is not None:
        layer_sets: list = layer_windows(n_layers, cfg.window_widths, cfg.window_starts)
    else:
        layer_sets = cfg.layer_sets if cfg.layer_sets is not None else default_layer_sets(n_layers)
    replies = None
    if cfg.replies:
        retain = load_split(cfg.source, cfg.retain_split)[: cfg.retain_examples] if cfg.retain_split else []
        replies = {"retain": retain, "max_new_tokens": cfg.max_new_tokens, "recall_ratio": cfg.recall_ratio,
                   "degenerate_max": cfg.degenerate_max}
    res = calibrate(model, tok, rows, [float(t) for t in cfg.taus], layer_sets, functional_budget=cfg.functional_budget,
                    min_factual=cfg.min_factual, max_length=cfg.max_length, replies=replies)
    text = calibration_table(res)
    print(text)
    if cfg.output_dir:
        with atomic_dir(cfg.output_dir, cfg.overwrite, {"model.path": cfg.model.path, "source": cfg.source}) as out:
            write_json(out / "calibration.json", {"config": to_dict(cfg), **res})
            heat = teacher_map_plot(res)
            if heat is not None:  # the teacher map as heat-maps, linked from the table
                (out / "teacher_map.png").write_bytes(png_bytes(heat))
                text += "\n\n![teacher map: forget recall and degenerate share per τ and layers](teacher_map.png)"
            (out / "calibration.md").write_text(text + "\n", encoding="utf-8")
    return res
