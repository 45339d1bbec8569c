"""HTML report and plots on hand-built results: values, embedded images, escaping, loading, skipping."""
import json

import pytest
from matplotlib.figure import Figure

from obliviate.errors import ObliviateError
from obliviate.eval.metrics import fmt
from obliviate.report import plots
from obliviate.report.html import load_results, render_html, write_html
from obliviate.report.markdown import COLUMNS

EVIL = "<script>alert('x')</script>"


def _history(n: int, geometry: bool) -> list[dict[str, float]]:
    rows = []
    for s in range(1, n + 1):
        row = {"step": float(s), "lr": 1e-3, "forget": -0.5 * s, "retain": 0.1 / s, "loss": -0.4 * s, "grad_norm": 1.0 + s}
        if geometry:
            row |= {"cos_f_r": -0.2, "cos_g_f": 0.7, "cos_g_r": 0.3, "conflict_share": 0.45}
        rows.append(row)
    return rows


def _metrics(fq: float | None, mu: float, gens: list[str], notes: list[str]) -> dict:
    return {"forget_quality": fq, "model_utility": mu, "forget_rougeL_recall": 0.25, "forget_fact_recall": 0.125,
            "forget_truth_ratio": 0.61, "forget_token_entropy": 0.9, "forget_repetition_rate": 0.0,
            "forget_degenerate_share": 0.0, "mia_loss_auc": 0.73, "forget_generations": gens, "notes": notes}


@pytest.fixture
def results() -> dict:
    return {
        "runs": {
            "npo+sago": {"metrics": _metrics(None, 0.5, [EVIL, "  "], ["no retain model: forget quality is n/a"]),
                         "history": _history(5, geometry=True),
                         "analysis": {"token_shift": {"factual": -1.5, "functional": -0.25, "selectivity": 1.25},
                                      "teacher_token_shift": {"factual": -2.0, "functional": -0.5, "selectivity": 1.5},
                                      "attention_entropy": [2.1, 1.9], "teacher_attention_entropy": [2.4, 2.0]}},
            "ga+nll": {"metrics": _metrics(2.5e-5, 0.375, ["Tom & <b>Jerry</b>", "ok"], []),
                       "history": _history(3, geometry=False),
                       "analysis": {"token_shift": {"factual": -40.0, "functional": -30.0, "selectivity": 10.0},
                                    "attention_entropy": [2.0, 1.5]}},
        },
        "questions": ["Who wrote <i>Book</i>?", "Where?"],
        "answers": ["A & B", "Here"],
        "seconds": 12.0,
    }


def test_render_html_tables_images_and_escaping(results, tmp_path):
    page = render_html(results)
    assert page.startswith("<!DOCTYPE html>")
    for run in results["runs"].values():  # the headline numbers are markdown_table's
        for key, _ in COLUMNS:
            assert f'<td class="num">{fmt(run["metrics"][key])}</td>' in page
    assert "n/a" in page and "2.5e-05" in page and "0.375" in page
    assert page.count('<img src="data:image/png;base64,') == 4  # headline, training, token shift, attention
    assert "<script" not in page.lower() and "&lt;script&gt;" in page
    assert "Tom &amp; &lt;b&gt;Jerry&lt;/b&gt;" in page and "Who wrote &lt;i&gt;Book&lt;/i&gt;?" in page
    assert "&#x27;  &#x27;" in page  # a blank answer stays visible as its repr
    assert "Gradient geometry" in page and "-0.200" in page  # only npo+sago logged geometry
    assert "npo+sago teacher" in page and "2.40, 2.00" in page
    assert "<th>better</th>" in page and "mia_loss_auc" in page and "↓" in page
    assert "npo+sago: no retain model: forget quality is n/a" in page
    out = tmp_path / "report.html"
    write_html(out, results)
    assert out.read_text(encoding="utf-8") == page


def test_render_html_skips_sections_without_data(results):
    for run in results["runs"].values():
        run.pop("history"), run.pop("analysis")
    page = render_html(results)
    assert page.count('<img src="data:image/png;base64,') == 1  # headline bars only
    assert "Gradient geometry" not in page and "attention entropy per layer" not in page
    bare = {"runs": {"muse": {"metrics": {"notes": []}}}}
    page = render_html(bare)
    assert "data:image/png" not in page and "<h2>Plots</h2>" not in page and "<table>" not in page


def test_plots_skip_missing_data_and_make_pngs(results):
    empty = {"runs": {"a": {"metrics": {}}, "b": {"metrics": {"forget_quality": None}, "history": []}}}
    for build in (plots.training_curves, plots.headline_bars, plots.token_shift_plot, plots.attention_entropy_plot):
        assert build(empty) is None
        fig = build(results)
        assert isinstance(fig, Figure)
        png = plots.png_bytes(fig)
        assert png.startswith(b"\x89PNG") and not fig.axes  # cleared after saving
    assert plots.figures(empty) == []
    assert [k for k, _, _ in plots.figures(results)] == ["headline", "training", "token_shift", "attention"]
    titles = [ax.get_title() for ax in plots.training_curves(results).axes if ax.get_visible()]
    assert "cos(g_f, g_r)" in titles and "nll" not in " ".join(titles).lower()


def test_load_results_demo_dir(results, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert load_results(tmp_path) == results


def test_load_results_run_dir(results, tmp_path):
    run = tmp_path / "npo-run"
    run.mkdir()
    src = results["runs"]["npo+sago"]
    metrics = {"history": src["history"], "train_seconds": 3.0, "eval": src["metrics"],
               "questions": results["questions"], "answers": results["answers"]}
    (run / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    res = load_results(run)
    assert res == {"runs": {"npo-run": {"metrics": src["metrics"], "history": src["history"]}},
                   "questions": results["questions"], "answers": results["answers"]}
    assert list(load_results(run, label="mine")["runs"]) == ["mine"]
    assert render_html(res).count("data:image/png;base64,") == 2  # headline and training curves


def test_load_results_errors(tmp_path):
    with pytest.raises(ObliviateError, match="neither results.json"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ObliviateError, match="cannot read"):
        load_results(tmp_path)
    (tmp_path / "results.json").write_text("[]", encoding="utf-8")
    with pytest.raises(ObliviateError, match="no 'runs'"):
        load_results(tmp_path)
