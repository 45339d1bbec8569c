"""Plugins: a package that names a module under the entry-point group obliviate.plugins adds its objective, which
`ls` lists, `validate` accepts and `obliviate unlearn` trains with, end to end."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    """A user's objective in their own package."""
    import torch.nn.functional as F

    from obliviate.objectives import forget_objective


    @forget_objective("my_npo", needs=("reference",))
    def my_npo(policy, reference, *, beta: float = 0.5):
        """My NPO: -(2/beta) mean log sigmoid(-beta (logp - logp_ref))."""
        return -(2.0 / beta) * F.logsigmoid(-beta * (policy.logp - reference.logp.detach())).mean()
''')


def install(tmp_path, monkeypatch, dist: str, entry: str, module: str, source: str | None) -> None:
    """An installed package `dist` (a dist-info folder on sys.path) naming `module` under obliviate.plugins as `entry`;
    the module's file holds `source` (None: no module at all). The plugins are loaded afresh on the next registry read."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    if source is not None:
        (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[obliviate.plugins]\n{entry} = {module}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    from obliviate import registry

    monkeypatch.setattr(registry, "_plugins", None)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed package `my-unlearning` (a dist-info folder on sys.path) whose entry point names its module."""
    install(tmp_path, monkeypatch, "my-unlearning", "mine", "my_unlearning", PLUGIN)
    from obliviate import registry

    yield "my_npo"
    from obliviate.objectives import FORGET

    FORGET._items.pop("my_npo", None)  # the next test's registry is the built-in one again
    sys.modules.pop("my_unlearning", None)
    registry._plugins = None


def test_a_plugins_objective_is_listed_validated_and_trained(plugin, model_dir, tmp_path, capsys, tofu_dir):
    from obliviate.cli import main
    from obliviate.objectives import FORGET

    assert FORGET.get("my_npo").name == "my_npo"  # the first registry read loads the plugin
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "plugins (mine = my_unlearning):" in out and "forget  my_npo       My NPO:" in out
    args = ["unlearn", f"model.path={model_dir}", f"data.source={tofu_dir}", "data.forget_split=forget01",
            "data.retain_split=retain99", "method.forget=my_npo", "method.forget_args={beta: 0.2}", "method.retain=nll",
            "train.max_steps=2", "train.batch_size=2", "train.progress=false", "eval.enabled=false"]
    assert main(["validate", *args[1:], f"output_dir={tmp_path / 'v'}"]) == 0
    assert "method: my_npo + nll" in capsys.readouterr().out
    assert main([*args, f"output_dir={tmp_path / 'run'}"]) == 0
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert len(history) == 2 and history[0]["forget"] == pytest.approx((2 / 0.2) * 0.6931471805599453, rel=1e-4)


def test_a_broken_plugin_is_named(tmp_path, monkeypatch, capsys):
    install(tmp_path, monkeypatch, "broken", "bad", "no_such_module_xyz", None)
    from obliviate import registry
    from obliviate.cli import main

    assert main(["validate", "method.forget=npo", "model.path=x", "data.source=tofu"]) == 2
    assert "obliviate plugin 'bad' (no_such_module_xyz, from package broken) failed to load" in capsys.readouterr().err
    registry._plugins = None


RULE_AND_METRIC = textwrap.dedent('''
    """A user's gradient rule with a setting of its own, and a metric, each declared in this one module."""
    from obliviate.eval.metrics import MetricInfo, register
    from obliviate.gradients import rule

    CALLS = []


    @rule("scaled_sum", elementwise=True, per_tensor=True)
    def scaled_sum(forget_grads, retain_grads, *, alpha, gamma, state=None, w: float = 0.5):
        """g = w·γ·g_f + α·g_r."""
        CALLS.append(w)
        return [None if f is None and r is None else
                (w * gamma * f if f is not None else 0) + (alpha * r if r is not None else 0)
                for f, r in zip(forget_grads, retain_grads)]


    register("my_bench", {"my_leak": MetricInfo("my_leak", False, 1, "my leak score")})
''')


def test_a_rule_with_a_setting_and_a_metric_each_need_one_place(tmp_path, monkeypatch, small_world, small_tok,
                                                                 trained_small):
    """docs/DESIGN.md's table: a rule with a parameter and a metric are declared in one module each (here one plugin
    module): the rule's setting is `method.combine.args`, defaults filled and checked, handed to it at every step;
    the metric is in the one metric table the report, the sweep and keep_best read."""
    import copy

    from obliviate.config import CombineConfig, MethodConfig, TrainConfig
    from obliviate.errors import ConfigError
    from obliviate.eval.metrics import metric_infos
    from obliviate.gradients import RULES
    from obliviate.train.unlearn import resolve_method, unlearn

    install(tmp_path, monkeypatch, "my-rules", "rules", "my_rules", RULE_AND_METRIC)
    from obliviate import registry
    from obliviate.eval import metrics

    try:
        assert metric_infos()["my_leak"].higher_is_better is False  # loads the plugin
        assert RULES.get("scaled_sum").defaults() == {"w": 0.5}
        method = MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule="scaled_sum", args={"w": 0.25}))
        assert resolve_method(method).settings()["combine"] == {"rule": "scaled_sum", "separate_backward": True,
                                                                "w": 0.25}
        with pytest.raises(ConfigError, match=r"rule 'scaled_sum' takes no setting\(s\) \['v'\]; .*\['w'\]"):
            resolve_method(MethodConfig(forget="ga", retain="nll", combine=CombineConfig(rule="scaled_sum",
                                                                                          args={"v": 1})))
        unlearn(copy.deepcopy(trained_small), small_tok, small_world.splits["forget10"][:4],
                small_world.splits["retain90"][:4], method,
                TrainConfig(max_steps=2, batch_size=2, progress=False), max_length=64)
        calls = sys.modules["my_rules"].CALLS
        assert calls and set(calls) == {0.25}
    finally:
        RULES._items.pop("scaled_sum", None)
        metrics._TABLES.pop("my_bench", None)
        sys.modules.pop("my_rules", None)
        registry._plugins = None


BENCH = textwrap.dedent('''
    """A user's benchmark: registered once, it is a choice of `obliviate eval`, its pre-flight runs and its metrics
    are declared where they are computed."""
    from dataclasses import dataclass

    from obliviate.eval.benchmarks import BENCHMARKS, BenchmarkSpec, register_benchmark
    from obliviate.eval.metrics import MetricInfo, register

    register("toy_bench", {"toy_rows": MetricInfo("toy_rows", True, 1, "rows of the toy data")})


    @dataclass(frozen=True)
    class ToySettings:
        source: str = ""
        repeat: int = 1


    def preflight(cfg):
        toy = BENCHMARKS.get("toy").settings(cfg)
        rows = [ln for ln in open(toy.source, encoding="utf-8").read().splitlines() if ln.strip()] * toy.repeat
        return rows, [f"toy rows: {len(rows)}"]


    def run(model, tokenizer, cfg, rows):
        return {"eval": {"toy_rows": float(len(rows)), "toy_vocab": tokenizer.vocab_size > 0}}


    register_benchmark(BenchmarkSpec("toy", "toy", run="my_bench:run", preflight="my_bench:preflight",
                                     settings_class="my_bench:ToySettings",
                                     help="a toy benchmark (sections.toy.source: a text file)"))
''')


def test_a_benchmark_registered_in_one_module_is_a_choice_checked_and_run(tmp_path, monkeypatch, model_dir, capsys):
    """docs/DESIGN.md's table: a benchmark is one registration (eval/benchmarks.py or a plugin module); the CLI's
    choices, the dispatch and the pre-flight (validate) derive from it."""
    from obliviate.cli import main
    from obliviate.eval.benchmarks import BENCHMARKS, BenchmarkSpec, register_benchmark

    install(tmp_path, monkeypatch, "my-bench", "bench", "my_bench", BENCH)
    from obliviate import registry
    from obliviate.eval import metrics

    data = tmp_path / "toy.txt"
    data.write_text("a\nb\nc\n", encoding="utf-8")
    try:
        assert "toy" in BENCHMARKS.names()
        own = f"sections={{toy: {{source: {data}, repeat: 2}}}}"  # its own settings section, checked by its class
        assert main(["validate", "--as", "eval", "benchmark=toy", f"model.path={model_dir}", own]) == 0
        assert "toy rows: 6" in capsys.readouterr().out  # the benchmark's own pre-flight
        args = ["--benchmark", "toy", "--model", str(model_dir), own]
        assert main(["eval", *args, "--out", str(tmp_path / "out")]) == 0
        got = json.loads((tmp_path / "out" / "metrics.json").read_text())
        assert got["benchmark"] == "toy" and got["eval"]["toy_rows"] == 6.0 and got["eval"]["toy_vocab"] is True
        bad = f"sections={{toy: {{source: {data}, repat: 2}}}}"
        assert main(["eval", "--benchmark", "toy", "--model", str(model_dir), bad, "--out", str(tmp_path / "y")]) == 2
        assert "sections.toy.repat" in capsys.readouterr().err and not (tmp_path / "y").exists()
        stray = f"sections={{toxic: {{source: {data}}}}}"
        assert main(["eval", "--benchmark", "toy", "--model", str(model_dir), stray, "--out", str(tmp_path / "y")]) == 2
        assert "sections: ['toxic'] belong to no registered benchmark; valid: ['toy']" in capsys.readouterr().err
        assert main(["eval", "--benchmark", "nope", "--model", str(model_dir), "--out", str(tmp_path / "x")]) == 2
        assert "unknown benchmark 'nope'; valid names: mcq, muse, rwku, tofu, toy" in capsys.readouterr().err
        assert not (tmp_path / "x").exists()
        with pytest.raises(ValueError, match="section 'toxic' is not one of the eval config's sections"):
            register_benchmark(BenchmarkSpec("toxic", "toxic", run="my_bench:run"))
    finally:
        BENCHMARKS._items.pop("toy", None)
        metrics._TABLES.pop("toy_bench", None)
        sys.modules.pop("my_bench", None)
        registry._plugins = None
