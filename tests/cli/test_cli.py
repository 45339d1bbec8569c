"""End-to-end CLI runs on a tiny world (real training, real metrics) and bad-input behaviour."""
import json

import pytest
import torch

from obliviate.cli import main
from obliviate.data.synthetic import make_world, write_world

TINY_DEMO = [
    "world.authors=10", "tiny.hidden_size=32", "tiny.vocab_size=400", "max_length=64",
    "retain_train.max_steps=25", "target_train.max_steps=10", "unlearn.max_steps=3",
    "eval.max_new_tokens=12", "retain_train.progress=false", "target_train.progress=false", "unlearn.progress=false",
]


def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", f"output_dir={out}", *TINY_DEMO]) == 0
    printed = capsys.readouterr().out
    assert "ASU_KL" in printed and "GradDiff" in printed and "forget quality" in printed
    res = json.loads((out / "results.json").read_text())
    assert set(res["runs"]) == {"retain", "target", "ASU_KL", "GradDiff"}
    for run in res["runs"].values():
        m = run["metrics"]
        assert 0 <= m["model_utility"] <= 1 and 0 <= m["forget_quality"] <= 1
        assert len(m["forget_generations"]) == len(res["questions"])
    assert res["runs"]["retain"]["metrics"]["forget_quality"] == pytest.approx(1.0)  # same TRs as itself
    assert len(res["runs"]["ASU_KL"]["history"]) == 3
    report = (out / "report.md").read_text()
    assert "Forget questions, before and after" in report and report.count("- gold:") == 3
    assert (out / "models" / "asu_kl" / "model.safetensors").is_file()
    assert (out / "world" / "forget10_perturbed.jsonl").is_file()
    _demo_model_is_publishable(out, res, capsys)


def _demo_model_is_publishable(out, res, capsys):
    """Each unlearned model of the demo has a model card the Hub reads and a receipt that verifies it."""
    from huggingface_hub import ModelCard

    model = out / "models" / "asu_kl"
    card = ModelCard.load(model / "README.md")
    meta = card.data
    assert meta.base_model is None and "trained its target (models/target) from scratch" in card.text
    assert meta.datasets is None and "datasets: none declared" in card.text
    receipt = json.loads((model / "receipt.json").read_text())
    assert set(meta.tags) >= {"unlearning", "obliviate", receipt["method"]["label"], "asu"}
    after = res["runs"]["ASU_KL"]["metrics"]
    results = {r.metric_type: r.metric_value for r in meta.eval_results}
    assert results["model_utility"] == pytest.approx(after["model_utility"])
    assert results["forget_quality"] == pytest.approx(after["forget_quality"])
    assert {r.dataset_config for r in meta.eval_results if r.metric_type.startswith("forget_")} == {"forget10_perturbed"}
    assert receipt["audit"]["verdict"] == res["runs"]["ASU_KL"]["audit"]["verdict"]
    shares = {a: "n/a" if v["share"] is None else f"{v['share']:.2f}" for a, v in receipt["audit"]["verdict"].items()}
    line = next(x for x in card.text.splitlines() if x.startswith("- audit: "))
    assert sorted(line.split("brought back: ")[1].split(" (receipt")[0].split(", ")) == sorted(
        f"{a} {s}" for a, s in shares.items())
    assert receipt["data"]["forget"]["n_rows"] == len(res["questions"]) and receipt["metrics"]["steps"] == 3
    assert receipt["weights"]["start"]["source"] == str(out / "models" / "target")
    capsys.readouterr()
    assert main(["verify", str(model / "receipt.json"), str(model), "--data", str(out / "world")]) == 0
    assert main(["push", str(model), "--repo-id", "me/demo-asu", "--dry-run"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in ("model.safetensors", "README.md", "receipt.json", "config.json"))


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    return write_world(make_world(10, seed=2, forget_percents=(10,)), tmp_path_factory.mktemp("w") / "world")


@pytest.fixture(scope="module")
def target_dir(world_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "target"
    rc = main(["finetune", "model.path=tiny", f"data.source={world_dir}", "data.splits=[full, real_authors, world_facts]",
               "tiny.hidden_size=32", "tiny.vocab_size=400", "train.max_steps=20", "train.lr=3e-3",
               "train.progress=false", "data.max_length=64", f"output_dir={out}"])
    assert rc == 0
    return out


def test_finetune_then_unlearn_then_eval(world_dir, target_dir, tmp_path):
    assert (target_dir / "model.safetensors").is_file() and (target_dir / "obliviate.yaml").is_file()
    out = tmp_path / "unlearned"
    rc = main(["unlearn", "--config", "configs/tofu/asu_kl.yaml", f"model.path={target_dir}",
               f"data.source={world_dir}", "data.forget_split=forget10", "data.retain_split=retain90",
               "data.max_length=64", "train.max_steps=2", "train.grad_accum=1", "train.progress=false",
               "eval.forget_split=forget10_perturbed", f"eval.retain_model={target_dir}",
               "eval.max_new_tokens=8", "eval.max_examples=4", f"output_dir={out}"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2 and {"forget", "retain", "loss", "lr"} <= set(metrics["history"][0])
    assert metrics["eval"]["forget_quality"] is not None and metrics["eval"]["model_utility"] is not None
    assert (out / "model.safetensors").is_file() and (out / "report.md").is_file()
    ev = tmp_path / "eval"
    assert main(["eval", f"model.path={out}", f"eval.source={world_dir}", "eval.forget_split=forget10_perturbed",
                 "eval.max_new_tokens=8", "eval.max_examples=3", f"output_dir={ev}"]) == 0
    assert json.loads((ev / "metrics.json").read_text())["eval"]["forget_quality"] is None  # no retain model given


def test_unlearn_runs_on_real_tofu_files(tofu_dir, target_dir, tmp_path):
    out = tmp_path / "tofu"
    rc = main(["unlearn", "--config", "configs/tofu/graddiff.yaml", f"model.path={target_dir}",
               f"data.source={tofu_dir}", "train.max_steps=1", "train.grad_accum=1", "train.progress=false",
               "data.max_length=64", "eval.max_examples=3", "eval.max_new_tokens=8", f"eval.retain_model={target_dir}",
               f"output_dir={out}"])
    assert rc == 0
    ev = json.loads((out / "metrics.json").read_text())["eval"]
    assert ev["forget_quality"] is not None and len(ev["forget_generations"]) == 3


def _fails(args, capsys, message):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("obliviate: error:") and message in err, err
    return err


def test_bad_inputs_exit_2_with_clear_message_and_no_output(world_dir, target_dir, tmp_path, capsys):
    out = tmp_path / "never"
    base = ["unlearn", f"model.path={target_dir}", f"data.source={world_dir}", "train.progress=false", f"output_dir={out}"]
    _fails(base + ["method.forget=gradient_ascent"], capsys, "valid names: asu, dpo, ga")
    _fails(base + ["method.forget_args={beta2: 1}"], capsys, "valid keys: ['layers', 'reduction', 'tau']")
    _fails(base + ["train.lrr=1"], capsys, "unknown key(s) ['train.lrr']")
    _fails(base + ["data.forget_split=nope"], capsys, "no split 'nope'")
    _fails(base + ["data.retain_split=full"], capsys, "also appear in the retain set")
    _fails(["unlearn", "model.path=/no/such/model", f"data.source={world_dir}", f"output_dir={out}"], capsys,
           "not a model directory")
    _fails(["unlearn", "--config", str(tmp_path / "missing.yaml")], capsys, "config file not found")
    assert not out.exists() and not list(tmp_path.glob(".never*"))


def test_malformed_data_names_the_line(target_dir, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.jsonl").write_text('{"question": "a?", "answer": "b"}\n{"question": "c?"\n')
    (data / "r.jsonl").write_text('{"question": "x?", "answer": "y"}\n')
    _fails(["unlearn", f"model.path={target_dir}", f"data.source={data}", "data.forget_split=f",
            "data.retain_split=r", f"output_dir={tmp_path / 'o'}"], capsys, "f.jsonl:2: invalid JSON")


def test_existing_output_is_never_clobbered(target_dir, world_dir, tmp_path, capsys):
    out = tmp_path / "keep"
    out.mkdir()
    (out / "precious.txt").write_text("results")
    _fails(["eval", f"model.path={target_dir}", f"eval.source={world_dir}", f"output_dir={out}"], capsys,
           "already exists and is not empty")
    assert (out / "precious.txt").read_text() == "results"


def test_ls_lists_components(capsys):
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "asu" in out and "kl" in out and "demo.yaml" in out
    listed = out.split("benchmarks (obliviate eval --benchmark):\n", 1)[1].split("presets (", 1)[0]
    assert [ln.split()[0] for ln in listed.splitlines()] == ["mcq", "muse", "rwku", "tofu"]  # from the registry


PRESETS = sorted(p.stem for p in __import__("pathlib").Path("configs/synthetic").glob("*.yaml"))


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_runs_a_step(name, world_dir, target_dir, tmp_path):
    """Each named method runs on the synthetic world (one step, no eval); its TOFU twin loads."""
    from obliviate.config import RunConfig, load_config

    load_config(RunConfig, f"configs/tofu/{name}.yaml")
    out = tmp_path / name
    rc = main(["unlearn", "--config", f"configs/synthetic/{name}.yaml", f"model.path={target_dir}",
               f"data.source={world_dir}", "data.max_length=48", "train.max_steps=1", "train.progress=false",
               "eval.enabled=false", f"output_dir={out}"])
    assert rc == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert len(history) == 1 and all(v == v for v in history[0].values())  # no NaN


def test_eval_tofu_shortcut_writes_every_tofu_metric(tofu_dir, target_dir, tmp_path, capsys):
    out = tmp_path / "ev"
    rc = main(["eval", "--benchmark", "tofu", "--data", str(tofu_dir), "--split", "forget01", "--model", str(target_dir),
               "--out", str(out), "eval.max_examples=3", "eval.max_new_tokens=8", "eval.closer_look=true",
               "eval.embedding_model=/no/such/embedder", "eval.nli_model=/no/such/nli"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())["eval"]
    for key in ("forget_quality", "model_utility", "forget_truth_ratio", "retain_prob", "world_facts_rougeL_recall",
                "forget_extraction_strength", "forget_exact_memorization", "privleak", "mia_min_k_auc",
                "mia_loss_auc", "mia_zlib_auc", "mia_min_k_plus_plus_auc", "fe", "mu", "forget_token_entropy"):
        assert key in m, key
    assert m["forget_quality"] is None and m["fe_complete"] is False  # no retain model; no NLI/embedder offline
    assert any("Cosine Similarity omitted" in n for n in m["notes"])
    report = (out / "report.md").read_text()
    assert "MU (over 12 of 18 numbers)" in report and "privleak" in report


def test_eval_mcq_and_muse_and_rwku_on_local_files(target_dir, tmp_path, capsys):
    mcq = tmp_path / "wmdp.jsonl"
    mcq.write_text("\n".join(json.dumps({"question": f"Q{i}?", "choices": ["a", "b", "c", "d"], "answer": i % 4})
                             for i in range(6)) + "\n")
    out = tmp_path / "mcq"
    assert main(["eval", "--benchmark", "mcq", "--data", str(mcq), "--model", str(target_dir), "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())["eval"]
    assert 0 <= m["wmdp_accuracy"] <= 1 and m["mcq_n"] == 6
    muse = _muse_fixture(tmp_path / "muse")
    out = tmp_path / "muse_out"
    assert main(["eval", "--benchmark", "muse", "--data", str(muse), "--model", str(target_dir), "--out", str(out),
                 "muse.verbmem_max_new_tokens=8", "muse.knowmem_max_new_tokens=4"]) == 0
    m = json.loads((out / "metrics.json").read_text())["eval"]
    assert {"verbmem_forget", "knowmem_forget", "privleak"} <= set(m)
    rwku = tmp_path / "rwku"
    rwku.mkdir()
    (rwku / "forget_level1.json").write_text(json.dumps([{"query": "Ann was born in ___.", "answer": "Orla",
                                                          "subject": "Ann", "level": "1", "type": "FB"}]))
    out = tmp_path / "rwku_out"
    assert main(["eval", "--benchmark", "rwku", "--data", str(rwku), "--model", str(target_dir), "--out", str(out),
                 "rwku.levels=[forget_level1]", "rwku.max_new_tokens=6"]) == 0
    m = json.loads((out / "metrics.json").read_text())["eval"]
    assert 0 <= m["rwku_forget_level1_rougeL_recall"] <= 1
    _fails(["eval", "--benchmark", "muse", "--split", "x", "--model", str(target_dir), "--out", str(tmp_path / "z")],
           capsys, "--split applies to tofu and mcq")


def _muse_fixture(muse):
    """A tiny MUSE directory in the hub layout (raw text, verbmem, knowmem, privleak)."""
    parts = {"verbmem/forget": [{"prompt": "The harbour was", "gt": "quiet at dawn."}],
             "knowmem/forget_qa": [{"question": "Where?", "answer": "Orla"}],
             "knowmem/forget_qa_icl": [{"question": "Who?", "answer": "Ann"}],
             "privleak/forget": [{"text": "The harbour was quiet."}],
             "privleak/holdout": [{"text": "A field of wheat."}],
             "raw/forget": [{"text": "The harbour of Orla was quiet at dawn. " * 6}],
             "raw/retain1": [{"text": "Wheat grows in the fields of Norvale every summer. " * 6}]}
    for part, rows in parts.items():
        (muse / part).parent.mkdir(parents=True, exist_ok=True)
        (muse / f"{part}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return muse


def test_unlearn_on_raw_text_with_muse_evaluation(target_dir, tmp_path):
    muse = _muse_fixture(tmp_path / "muse")
    out = tmp_path / "run"
    rc = main(["unlearn", "--config", "configs/muse/npo.yaml", f"model.path={target_dir}", f"data.source={muse}",
               "data.max_length=24", "train.max_steps=2", "train.batch_size=2", "train.grad_accum=1",
               "train.progress=false", f"muse.source={muse}", "muse.retrain_model=null",
               "muse.verbmem_max_new_tokens=6", "muse.knowmem_max_new_tokens=4", f"output_dir={out}"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["history"]) == 2 and {"verbmem_forget", "knowmem_forget", "privleak"} <= set(metrics["eval"])
    assert "verbmem_forget" in (out / "report.md").read_text()


def test_refusal_objectives_refuse_raw_text(target_dir, tmp_path, capsys):
    muse = _muse_fixture(tmp_path / "muse")
    _fails(["unlearn", "--config", "configs/muse/npo.yaml", f"model.path={target_dir}", f"data.source={muse}",
            "method.forget=idk", "method.forget_args={}", "data.max_length=24", f"output_dir={tmp_path / 'x'}"], capsys,
           "the data is raw text")


def test_help_config_lists_keys_with_help(capsys):
    assert main(["unlearn", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "method.combine.rule" in out and "gradient rule" in out and "train.lr" in out


def test_report_command_writes_html_for_a_run(world_dir, target_dir, tmp_path):
    out = tmp_path / "run"
    assert main(["unlearn", "--config", "configs/synthetic/graddiff.yaml", f"model.path={target_dir}",
                 f"data.source={world_dir}", "data.max_length=48", "train.max_steps=2", "train.progress=false",
                 "eval.max_examples=3", "eval.max_new_tokens=6", "eval.retain_model=null", f"output_dir={out}"]) == 0
    assert main(["report", str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "ga+nll" in html and "data:image/png;base64," in html
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2


def test_continual_unlearning_from_the_cli(tmp_path, small_tok):
    from obliviate.data.synthetic import make_world

    world = write_world(make_world(10, seed=1, forget_percents=(30,)), tmp_path / "w")
    target = tmp_path / "t"
    assert main(["finetune", "model.path=tiny", f"data.source={world}", "data.splits=[full]", "tiny.hidden_size=32",
                 "tiny.vocab_size=400", "train.max_steps=10", "train.lr=3e-3", "train.progress=false",
                 "data.max_length=48", f"output_dir={target}"]) == 0
    out = tmp_path / "c"
    assert main(["unlearn", "--config", "configs/synthetic/asu_kl.yaml", f"model.path={target}", f"data.source={world}",
                 "data.forget_split=forget30", "data.retain_split=retain70", "data.max_length=48",
                 "continual.requests=3", "continual.max_new_tokens=6", "train.max_steps=1", "train.progress=false",
                 "eval.forget_split=forget30_perturbed", "eval.retain_model=null", "eval.max_examples=3",
                 "eval.max_new_tokens=6", f"output_dir={out}"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["continual"]["histories"]) == 3 and len(metrics["history"]) == 3
    steps = metrics["continual"]["steps"]
    assert [len(s["forget"]) for s in steps] == [1, 2, 3]  # every earlier request re-checked
    assert "after request" in (out / "continual.md").read_text()


def test_validate_checks_a_recipe_without_training(world_dir, target_dir, tmp_path, capsys):
    base = ["validate", "--config", "configs/synthetic/npo_pcgrad.yaml", f"model.path={target_dir}",
            f"data.source={world_dir}", "eval.retain_model=null", f"output_dir={tmp_path / 'o'}"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "valid (unlearn config):" in out and "rule pcgrad" in out and "29 forget" not in out  # small world: 1 author
    assert not (tmp_path / "o").exists()
    _fails(base + ["data.retain_split=full"], capsys, "also appear in the retain set")
    _fails(base + ["method.combine.rule=sagoo"], capsys, "valid names:")
    _fails(base + [f"model.path={tmp_path}"], capsys, "no config.json")


def test_ls_into_a_closed_pipe_is_quiet():
    """`obliviate ls | head -1`: the reader has left; exit 141 with no BrokenPipeError traceback on stderr."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from obliviate.cli import main; import sys; sys.exit(main(['ls']))"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read()
    assert proc.wait() == 141 and "Traceback" not in err, err


def test_unlearn_evaluates_during_training_and_keeps_the_best_step(world_dir, target_dir, tmp_path, capsys,
                                                                    monkeypatch):
    from safetensors.torch import load_file

    from obliviate.train.monitor import Monitor

    seen, consider = {}, Monitor._consider

    def record(self, step, value, model):  # the weights every evaluation saw
        seen[step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        return consider(self, step, value, model)

    monkeypatch.setattr(Monitor, "_consider", record)
    out = tmp_path / "best"
    rc = main(["unlearn", "--config", "configs/tofu/graddiff.yaml", f"model.path={target_dir}",
               f"data.source={world_dir}", "data.forget_split=forget10", "data.retain_split=retain90",
               "data.max_length=64", "train.max_steps=5", "train.grad_accum=1", "train.progress=false",
               "train.lr=5e-3", "eval.forget_split=forget10_perturbed", "eval.retain_model=null", "eval.max_new_tokens=8",
               "eval.max_examples=4",
               "eval.every_steps=2", "eval.during_rows=3", "eval.keep_best=retain_rougeL_recall - forget_rougeL_recall",
               f"output_dir={out}"])
    assert rc == 0
    metrics = json.loads((out / "metrics.json").read_text())
    hist = metrics["history"]
    evaluated = [h for h in hist if "eval_forget_rougeL_recall" in h]
    assert [hist.index(h) + 1 for h in evaluated] == [2, 4, 5]  # every 2 steps and the last
    scores = {hist.index(h) + 1: h["eval_retain_rougeL_recall"] - h["eval_forget_rougeL_recall"] for h in evaluated}
    assert metrics["best_step"] == max(scores, key=lambda s: (scores[s], -s))
    assert metrics["best_score"] == pytest.approx(scores[metrics["best_step"]])
    assert f"kept the weights of step {metrics['best_step']}" in capsys.readouterr().out
    # the saved model holds the best step's weights, not the last step's
    assert metrics["best_step"] != 5, "the run's best step must differ from its last for this check to bite"
    saved = load_file(str(out / "model.safetensors"))
    best = seen[metrics["best_step"]]
    assert all(torch.equal(saved[n], best[n]) for n in saved if n in best) and set(saved) & set(best)
    assert any(not torch.equal(saved[n], seen[5][n]) for n in saved if n in seen[5])


def test_bad_evaluation_during_training_is_refused_before_loading(world_dir, target_dir, tmp_path, capsys):
    base = ["unlearn", "--config", "configs/tofu/graddiff.yaml", f"model.path={target_dir}", f"data.source={world_dir}",
            "data.forget_split=forget10", "data.retain_split=retain90", "eval.forget_split=forget10_perturbed",
            "eval.retain_model=null"]
    for extra, msg in ((["eval.every_steps=2", "eval.keep_best=forget_rouge"], "'forget_rouge' names no metric"),
                       (["eval.keep_best=model_utility"], "eval.keep_best='model_utility' is impossible"),
                       (["eval.every_steps=0"], "eval.every_steps=0 is impossible")):
        out = tmp_path / "x"
        assert main(base + extra + [f"output_dir={out}"]) == 2
        assert msg in capsys.readouterr().err and not out.exists()


def test_every_commands_help_renders_its_own_text():
    """argparse %-formats help strings: a bare % prints its internals instead of the text."""
    import argparse

    from obliviate.cli import COMMANDS, parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        text = sub.choices[name].format_help()
        assert "option_strings" not in text and "%(" not in text, name
    audit = sub.choices["audit"].format_help()
    assert "(the 100% reference)" in " ".join(audit.split()) and "(the 0% reference)" in " ".join(audit.split())


def test_ls_lists_every_preset_with_its_first_whole_sentence():
    from pathlib import Path

    from obliviate.cli.ls import first_sentence, list_components

    assert first_sentence("# Second demo: retention first. NPO+GD unlearned\n# with the sum.\nkey: 1\n") == \
        "Second demo: retention first."
    assert first_sentence("# A line that goes on\n# to the next (e.g. here) and ends.\n# More.\n") == \
        "A line that goes on to the next (e.g. here) and ends."
    assert first_sentence("key: 1\n") == ""
    configs = Path(__file__).resolve().parents[2] / "configs"
    text = list_components()
    listed = text.split("presets (", 1)[1].splitlines()[1:]
    assert len(listed) == len(list(configs.rglob("*.yaml")))
    assert any(line.split()[0] == "gpu/asu_tofu_llama2_7b/asu_kl_forget10.yaml" for line in listed)
    for line in listed:  # no summary cut mid-sentence
        assert line.rstrip().endswith((".", ")", ":")) or len(line.split()) == 1, line


ENTRY = """
import atexit, os, sys
if sys.argv[2] == "torch":
    import torch
import obliviate.cli as cli


class Teardown:
    def __del__(self, write=os.write):  # bound now: the module's globals are gone by then
        write(2, b"teardown")


kept = Teardown()  # its __del__ runs only if the interpreter tears its modules down


def fake_main(argv=None):
    atexit.register(lambda: open(sys.argv[1], "w").write("ran"))  # a tracker's exit function, say
    print("out", end="")  # not flushed yet
    if sys.argv[3] == "raise":
        raise RuntimeError("boom")
    return 3


cli.main = fake_main
cli.entry()
"""


@pytest.mark.parametrize("mode", ["torch", "plain"])
def test_the_console_script_keeps_exit_status_output_and_exit_functions(mode, tmp_path):
    """entry(): main's status and output, and every exit function the run registered, survive; with torch loaded the
    module teardown is skipped; an exception escaping main exits 1."""
    import subprocess
    import sys

    marker = tmp_path / "ran"
    res = subprocess.run([sys.executable, "-c", ENTRY, str(marker), mode, "return"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 3 and res.stdout == "out" and marker.read_text() == "ran"
    assert ("teardown" in res.stderr) is (mode == "plain")
    marker.unlink()
    res = subprocess.run([sys.executable, "-c", ENTRY, str(marker), mode, "raise"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and "RuntimeError: boom" in res.stderr and marker.read_text() == "ran"


COMMAND = '''
"""`obliviate hello`: a command in one module (docs/DESIGN.md's extension table)."""
import argparse

from obliviate.errors import ConfigError

HELP = "say hello (a test command)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")


def run(args: argparse.Namespace) -> int:
    if args.name == "nobody":
        raise ConfigError("name: nobody is not a name; give one")
    print(f"hello {args.name}")
    return 0
'''


def test_a_command_is_one_module_and_one_line_of_the_dispatch_table(tmp_path, monkeypatch, capsys):
    """docs/DESIGN.md: a command is its module plus its entry in cli.COMMANDS; the parser, --help, the dispatch and
    the one-line errors with exit status 2 come from there."""
    import importlib
    import sys

    from obliviate import cli

    (tmp_path / "my_hello.py").write_text(COMMAND, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "hello", importlib.import_module("my_hello"))
    try:
        assert cli.main(["hello", "world"]) == 0 and capsys.readouterr().out == "hello world\n"
        assert cli.main(["hello", "nobody"]) == 2
        assert capsys.readouterr().err == "obliviate: error: name: nobody is not a name; give one\n"
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        assert "say hello (a test command)" in capsys.readouterr().out
    finally:
        sys.modules.pop("my_hello", None)


def test_python_dash_m_runs_the_same_command_line(tmp_path):
    """`python -m obliviate` (no console script needed): a listing exits 0, a bad command exits 2 naming it."""
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "obliviate", "ls"], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and "ASU_KL" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "obliviate", "unlern"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "unlern" in bad.stderr
