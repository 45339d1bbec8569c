"""Every bad input is a clean outcome (issue 10): exactly one stderr line `obliviate: error: ...` naming the
problem and the fix, exit code 2, no traceback, nothing written (an existing output_dir stays byte-identical),
and `obliviate validate` rejects what `unlearn` would reject before training, with the same line.

Each case runs `obliviate.cli.main` in-process on a tiny 2-layer model and the small synthetic world; the
errors come from the pre-flight, so no case trains."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from obliviate.cli import main

U = ["unlearn", "model.path={model}", "data.source={world}", "output_dir={out}", "train.progress=false",
     "train.max_steps=1", "eval.max_examples=2", "eval.max_new_tokens=4"]
BAD = ["data.source={bad}", "data.retain_split=r", "eval.enabled=false"]  # + data.forget_split=<bad file>
TEXT = ["data.source={text}", "data.format=text", "data.forget_split=raw/forget", "data.retain_split=raw/retain1"]
CAL = ["calibrate", "model.path={model}", "source={world}", "split=forget10", "max_examples=2", "output_dir={out}"]
UNREACHABLE = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_DATASETS_OFFLINE": None,
               "HTTPS_PROXY": None, "https_proxy": None, "HTTP_PROXY": None, "http_proxy": None, "ALL_PROXY": None,
               "all_proxy": None, "HF_ENDPOINT": "http://127.0.0.1:9"}


@dataclass
class Case:
    id: str
    args: list[str]
    expect: str  # a distinctive part of the one error line
    validate: bool = True  # `validate` with the same arguments must fail with the same line
    before: str = "absent"  # the output_dir before the run: absent | dir | file | model
    env: dict = field(default_factory=dict)
    watch: str = "out"  # the tree that must stay byte-identical: out | cwd


def _case(id: str, extra: list[str], expect: str, base: list[str] | None = None, **kw) -> Case:
    return Case(id, (U if base is None else base) + extra, expect, **kw)


CASES = [
    # --- config files and keys
    _case("config-missing", ["--config", "{tmp}/missing.yaml"], "config file not found"),
    _case("config-is-a-directory", ["--config", "{tmp}"], "(it is a directory)"),
    _case("config-bad-syntax", ["--config", "{files}/syntax.yaml"], "invalid YAML"),
    _case("config-top-level-list", ["--config", "{files}/list.yaml"], "the top level must be a mapping"),
    _case("config-duplicate-section", ["--config", "{files}/dup_section.yaml"],
          "duplicate key 'method' at lines 1 and 4"),
    _case("config-duplicate-nested-key", ["--config", "{files}/dup_nested.yaml"],
          "duplicate key 'method.forget_args.tau' at lines 4 and 5"),
    _case("override-duplicate-key", ["method.forget_args={tau: 2, tau: 3}"], "duplicate key 'tau' at columns"),
    _case("unknown-top-level-key", ["outptu_dir=x"], "unknown key(s) ['outptu_dir']"),
    _case("unknown-nested-key", ["train.lrr=1"], "unknown key(s) ['train.lrr']"),
    _case("unknown-section", ["nosuchsection.a=1"], "unknown key(s) ['nosuchsection']"),
    _case("override-without-equals", ["train.lr"], "must look like key.sub=value"),
    _case("bad-type-float", ["train.lr=abc"], "train.lr: expected float"),
    _case("bad-type-bool", ["overwrite=maybe"], "overwrite: expected bool"),
    _case("section-given-a-scalar", ["train=5"], "train: expected a mapping"),
    _case("batch-size-zero", ["train.batch_size=0"], "train.batch_size=0 is impossible: it must be >= 1"),
    _case("unknown-scheduler", ["train.scheduler=wiggly"], "one of linear"),
    _case("warmup-ratio-one", ["train.warmup_ratio=1"], "train.warmup_ratio=1.0 is impossible"),
    _case("checkpoint-every-without-dir", ["train.checkpoint_every=5"], "0 unless train.checkpoint_dir is set"),
    _case("data-format-unknown", ["data.format=csv"], "data.format='csv' is impossible"),
    _case("data-max-length-tiny", ["data.max_length=4"], "data.max_length=4 is impossible"),
    _case("negative-gamma", ["method.gamma=-1"], "method.gamma=-1.0 is impossible"),
    _case("eval-protocol-unknown", ["eval.protocol=fast"], "tofu or closer_look"),
    _case("model-dtype-unknown", ["model.dtype=float8"], "model.dtype='float8' is impossible"),
    # --- method: names, keys, rules
    _case("unknown-objective", ["method.forget=gradient_ascent"], "valid names: asu, dpo, ga"),
    _case("unknown-hyper-parameter", ["method.forget_args={beta2: 1}"], "valid keys: ['layers', 'reduction', 'tau']"),
    _case("unknown-retain-term", ["method.retain=klx"], "unknown retain term 'klx'"),
    _case("unknown-rule", ["method.combine.rule=sagoo"], "unknown gradient rule 'sagoo'"),
    _case("bad-reduction", ["method.forget_args={reduction: mean}"], "asu: reduction must be one of"),
    _case("rule-needs-retain", ["method.combine.rule=sago", "method.retain=null"], "method.retain is null"),
    _case("rule-needs-separate-backward", ["method.combine.rule=sago", "method.combine.separate_backward=false"],
          "needs separate forget and retain backward passes"),
    # --- ASU's tau and layers
    _case("tau-zero", ["method.forget_args={tau: 0}"], "method.forget_args.tau=0 is impossible"),
    _case("tau-negative", ["method.forget_args={tau: -1}"], "method.forget_args.tau=-1 is impossible"),
    _case("tau-text", ["method.forget_args={tau: abc}"], "method.forget_args.tau='abc' is impossible"),
    _case("tau-infinite", ["method.forget_args={tau: .inf}"], "method.forget_args.tau=inf is impossible"),
    _case("tau-bool", ["method.forget_args={tau: true}"], "method.forget_args.tau=True is impossible"),
    _case("tau-one", ["method.forget_args={tau: 1}"], "tau=1 makes the teacher identical to the model"),
    _case("tau-below-one", ["method.forget_args={tau: 0.5}"], "tau=0.5 < 1 sharpens the teacher's attention"),
    _case("layers-empty", ["method.forget_args={layers: []}"], "method.forget_args.layers=[] is impossible"),
    _case("layers-word", ["method.forget_args={layers: first}"], "method.forget_args.layers='first' is impossible"),
    _case("layers-float", ["method.forget_args={layers: [0.5]}"], "method.forget_args.layers=[0.5] is impossible"),
    _case("layers-out-of-range", ["method.forget_args={layers: [5]}"],
          "layer index 5 is out of range for this model, which has 2 layers"),
    _case("layers-negative-out-of-range", ["method.forget_args={layers: [-3]}"], "layer index -3 is out of range"),
    _case("layers-one-of-two-out-of-range", ["method.forget_args={layers: [0, 2]}"], "layer index 2 is out of range"),
    _case("rmu-layer-out-of-range", ["method.forget=rmu", "method.forget_args={layer: 7}"],
          "method.forget_args.layer=7 must be a decoder layer index 0..1"),
    _case("retain-hidden-layer-out-of-range", ["method.forget=rmu", "method.forget_args={layer: 1}",
                                               "method.retain=hidden_mse"],
          "method.retain_args.layer=7 must be a decoder layer index 0..1"),
    _case("rmu-forget-and-retain-layers-differ", ["method.forget=rmu", "method.forget_args={layer: 1}",
                                                  "method.retain=hidden_mse", "method.retain_args={layer: 0}"],
          "method.forget_args.layer=1 and method.retain_args.layer=0 differ"),
    _case("rmu-trainable-params-unknown", ["method.forget=rmu", "method.forget_args={layer: 1, trainable_params: all}"],
          "trainable_params must be 'wmdp', 'layers'"),
    _case("rmu-trainable-layers-out-of-range",
          ["method.forget=rmu", "method.forget_args={layer: 1, trainable_layers: [9]}"],
          "trainable_layers [9] must be indices of the 2 decoder layers"),
    _case("refusals-on-raw-text", ["method.forget=idk", "method.forget_args={}", "data.format=text"],
          "the data is raw text"),
    _case("refusal-file-missing", ["method.forget=idk", "method.forget_args={}", "method.refusals={tmp}/no.txt"],
          "refusal file not found"),
    _case("continual-on-raw-text", ["continual.requests=2", "data.format=text"],
          "continual unlearning is evaluated on QA rows"),
    # --- data
    _case("data-source-unset", ["data.source="], "data.source is not set"),
    _case("data-source-missing", ["data.source={tmp}/nothing"], "is neither a file, a directory, a hub dataset id (owner/name with a split) nor a data set shipped"),
    _case("forget-split-missing", ["data.forget_split=nope"], "no split 'nope'"),
    _case("shipped-tofu-split-unknown", ["data.source=tofu", "data.forget_split=forget02"],
          "no split 'forget02' in the shipped tofu data; the splits shipped are: forget01, forget01_perturbed,"),
    _case("forget-retain-overlap", ["data.retain_split=full"], "also appear in the retain set"),
    _case("malformed-json-line", BAD + ["data.forget_split=badjson"], "badjson.jsonl:2: invalid JSON"),
    _case("empty-data-file", BAD + ["data.forget_split=empty"], "the split is empty"),
    _case("row-without-answer", BAD + ["data.forget_split=noanswer"], "missing field 'answer'"),
    _case("answer-not-a-string", BAD + ["data.forget_split=numeric"], "field 'answer' must be a string"),
    _case("json-file-not-a-list", BAD + ["data.forget_split=notlist"], "must hold a list of objects"),
    _case("text-row-without-text", ["data.source={bad}", "data.format=text", "data.forget_split=noanswer",
                                    "data.retain_split=r", "method.retain=null"], "missing field 'text'"),
    # --- evaluation after training: splits and models, checked before it
    _case("eval-split-missing", ["eval.forget_split=nope_perturbed"], "no split 'nope_perturbed'"),
    _case("eval-no-split", ["eval.forget_split=null", "eval.retain_split=null", "eval.real_authors_split=null",
                            "eval.world_facts_split=null"], "no evaluation split configured"),
    _case("eval-holdout-missing", ["eval.holdout_split=holdout99"], "no split 'holdout99'"),
    _case("retain-model-without-forget-split", ["eval.retain_model={model}", "eval.forget_split=null"],
          "eval.retain_model is set but eval.forget_split is null"),
    _case("retain-model-on-unperturbed-split", ["eval.retain_model={model}", "eval.forget_split=forget10"],
          "forget split cannot give truth ratios"),
    _case("retain-model-missing", ["eval.retain_model={tmp}/no_retain"], "eval.retain_model '{tmp}/no_retain' is not"),
    _case("retain-model-without-weights", ["eval.retain_model={cfgonly}"], "has a config.json but no weights"),
    _case("retain-model-pickle-only", ["eval.retain_model={pickle}"], "holds only PyTorch pickle weights"),
    _case("embedding-model-path-to-nothing", ["eval.closer_look=true", "eval.embedding_model=/no/such/embedder"],
          "eval.embedding_model '/no/such/embedder' is not a model"),
    _case("muse-source-missing", TEXT + ["muse.source={tmp}/no_muse"], "is neither a directory nor a hub dataset id"),
    _case("muse-source-without-muse-files", TEXT + ["muse.source={world}"], "no MUSE data found"),
    _case("muse-retrain-model-missing", TEXT + ["muse.source={text}", "muse.retrain_model=./no_such_retrain"],
          "muse.retrain_model './no_such_retrain' is not a model directory"),
    # --- model paths
    _case("model-path-unset", ["model.path="], "model.path is not set"),
    _case("model-absolute-path-to-nothing", ["model.path=/no/such/model"],
          "model.path '/no/such/model' is not a model directory: it does not exist"),
    _case("model-dot-path-to-nothing", ["model.path=./no_such_model"],
          "model.path './no_such_model' is not a model directory"),
    _case("model-dotdot-path-to-nothing", ["model.path=../no_such_model"],
          "model.path '../no_such_model' is not a model"),
    _case("model-deep-relative-path-to-nothing", ["model.path=runs/a/b"], "model.path 'runs/a/b' is not a model"),
    _case("model-dir-without-config", ["model.path={world}"], "has no config.json: not a model directory"),
    _case("model-path-is-a-file", ["model.path={world}/full.jsonl"], "is a file, not a model directory"),
    _case("model-pickle-only", ["model.path={pickle}"], "holds only PyTorch pickle weights (pytorch_model.bin)"),
    _case("model-config-only", ["model.path={cfgonly}"], "has a config.json but no weights"),
    _case("tokenizer-path-to-nothing", ["model.tokenizer=/no/such/tok"],
          "model.tokenizer '/no/such/tok' is not a tokenizer"),
    _case("gguf-file-missing", ["model.path={tmp}/gone.gguf"], "GGUF file not found"),
    _case("hub-id-offline-not-cached", ["model.path=obliviate-tests/no-such-model-x"],
          "not in the hub cache and HF_HUB_OFFLINE=1 forbids downloading it",
          env={"HF_HUB_OFFLINE": "1"}),
    _case("hub-model-unreachable", ["model.path=obliviate-tests/no-such-model-x"],
          "as a hub id it needs the Hugging Face hub, which is unreachable (cannot connect to 127.0.0.1:9",
          env=UNREACHABLE),
    _case("hub-data-unreachable", ["data.source=obliviate-tests/no-such-data"],
          "data source 'obliviate-tests/no-such-data': no such file or folder in ",
          env=UNREACHABLE),
    # --- output directory and other written paths
    _case("output-dir-unset", ["output_dir="], "output_dir is not set", validate=False),
    _case("output-dir-exists", [], "already exists and is not empty", before="dir"),
    _case("output-dir-is-a-file", [], "already exists and is a file; choose another output_dir", before="file"),
    _case("output-dir-under-a-file", ["output_dir={world}/full.jsonl/run"], "which is a file, not a directory"),
    _case("output-dir-unwritable", ["output_dir=/proc/obliviate-test-run"], "cannot create directories in /proc"),
    _case("output-dir-is-cwd", ["output_dir=.", "overwrite=true"], "is the current directory or contains it",
          watch="cwd"),
    _case("output-dir-contains-cwd", ["output_dir=..", "overwrite=true"], "is the current directory or contains it",
          watch="cwd"),
    _case("overwrite-would-delete-model", ["model.path={out}/model", "overwrite=true"], "contains model.path",
          before="model"),
    _case("overwrite-would-delete-data", ["data.source={out}/model/..", "overwrite=true"], "contains data.source",
          before="model"),
    _case("checkpoint-dir-inside-output", ["train.checkpoint_dir={out}/ckpt"],
          "train.checkpoint_dir {out}/ckpt lies inside"),
    _case("checkpoint-dir-is-a-file", ["train.checkpoint_dir={world}/full.jsonl"], "is a file, not a directory"),
    _case("checkpoint-dir-unwritable", ["train.checkpoint_dir=/proc/obliviate-ckpt"],
          "cannot create directories in /proc"),
    # --- other commands (no validate counterpart)
    _case("calibrate-layers-out-of-range", ["layer_sets=[[7]]"], "layer_sets[0]=[7]: layer index 7 is out of range",
          base=CAL, validate=False),
    _case("calibrate-empty-layer-set", ["layer_sets=[[]]"], "layer_sets[0]=[] is impossible", base=CAL, validate=False),
    _case("calibrate-tau-zero", ["taus=[0]"], "taus=[0] is impossible", base=CAL, validate=False),
    _case("calibrate-split-missing", ["split=nope"], "no split 'nope'", base=CAL, validate=False),
    _case("calibrate-output-under-a-file", ["output_dir={world}/full.jsonl/x"], "which is a file", base=CAL,
          validate=False),
    _case("finetune-output-under-a-file", ["model.path=tiny", "data.source={world}", "data.splits=[full]",
                                           "output_dir={world}/full.jsonl/x"], "which is a file",
          base=["finetune"], validate=False),
    _case("eval-model-path-to-nothing", ["model.path=/no/such/model", "eval.source={world}", "output_dir={out}"],
          "model.path '/no/such/model' is not a model directory", base=["eval"], validate=False),
    _case("eval-split-for-muse", ["--benchmark", "muse", "--split", "x", "--model", "{model}", "--out", "{out}"],
          "--split applies to tofu and mcq", base=["eval"], validate=False),
    _case("eval-unknown-benchmark", ["benchmark=squad"], "unknown benchmark 'squad'; valid names: mcq, muse, rwku, tofu", base=["eval"],
          validate=False),
    _case("demo-config-missing", ["--config", "{tmp}/missing.yaml"], "config file not found", base=["demo"],
          validate=False),
    _case("demo-layers-out-of-range", ["methods.ASU_KL.forget_args={tau: 2, layers: [3]}", "tiny.layers=2",
                                       "output_dir={out}"],
          "methods.ASU_KL.forget_args.layers=[3]: layer index 3 is out of range", base=["demo"], validate=False),
    _case("demo-tau-one", ["methods.ASU_KL.forget_args={tau: 1}", "output_dir={out}"],
          "tau=1 makes the teacher identical", base=["demo"], validate=False),
    # --- issue 11/12 switches and sections
    _case("precision-unknown", ["train.precision=fp8"], "train.precision='fp8' is impossible"),
    _case("compile-backend-unknown", ["train.compile=true", "train.compile_backend=nonsense"],
          "train.compile_backend='nonsense' is not a torch.compile backend here; valid:"),
    _case("audit-on-raw-text", [*TEXT, "audit.enabled=true"], "audit.enabled=true attacks answers to questions"),
    _case("audit-unknown-attack", ["audit.enabled=true", "audit.attacks=[relearn, jailbreak]"], "audit.attacks"),
    _case("audit-retain-model-to-nothing", ["audit.enabled=true", "audit.retain_model=/no/such/model"],
          "audit.retain_model '/no/such/model' is not a model directory"),
]


def _fill(text: str, names: dict[str, str]) -> str:
    """Put the case's paths into {model}, {out}, ... (YAML braces such as {tau: 0} stay as they are)."""
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


def _tree(path: Path) -> dict[str, str] | None:
    """Every entry under `path` (itself included) with its kind, mode and content hash; None if absent."""
    if not path.exists():
        return None
    items = [path] + (sorted(path.rglob("*")) if path.is_dir() else [])
    out = {}
    for p in items:
        kind = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        out[str(p.relative_to(path))] = f"{kind} {oct(p.stat().st_mode)}"
    return out


@pytest.fixture(scope="module")
def ctx(small_world, small_tok, tmp_path_factory):
    """Paths the cases refer to: a tiny 2-layer model, the world, broken data and config files, broken models."""
    from obliviate.data.synthetic import write_world
    from obliviate.modeling.tiny import tiny_llama

    root = tmp_path_factory.mktemp("bad_inputs")
    model = root / "model"
    tiny_llama(small_tok, hidden_size=32, num_layers=2, num_heads=4, seed=0).save_pretrained(model)
    small_tok.save_pretrained(model)
    pickle, cfgonly = root / "pickle_model", root / "config_only"
    for d in (pickle, cfgonly):
        d.mkdir()
        shutil.copy(model / "config.json", d / "config.json")
    (pickle / "pytorch_model.bin").write_bytes(b"not loaded: the name alone is refused")
    bad = root / "bad"
    bad.mkdir()
    (bad / "r.jsonl").write_text('{"question": "x?", "answer": "y"}\n')
    (bad / "badjson.jsonl").write_text('{"question": "a?", "answer": "b"}\n{"question": "c?"\n')
    (bad / "empty.jsonl").write_text("")
    (bad / "noanswer.jsonl").write_text('{"question": "a?"}\n')
    (bad / "numeric.jsonl").write_text('{"question": "a?", "answer": 3}\n')
    (bad / "notlist.json").write_text('{"question": "a?", "answer": "b"}')
    text = root / "muse"  # raw text to unlearn and a MUSE evaluation set, in the hub layout
    for part, rows in {"verbmem/forget": [{"prompt": "The harbour was", "gt": "quiet at dawn."}],
                       "knowmem/forget_qa": [{"question": "Where?", "answer": "Orla"}],
                       "privleak/forget": [{"text": "The harbour was quiet."}],
                       "privleak/holdout": [{"text": "A field of wheat."}],
                       "raw/forget": [{"text": "The harbour of Orla was quiet at dawn. " * 4}],
                       "raw/retain1": [{"text": "Wheat grows in the fields of Norvale every summer. " * 4}]}.items():
        (text / part).parent.mkdir(parents=True, exist_ok=True)
        (text / f"{part}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    files = root / "files"
    files.mkdir()
    (files / "syntax.yaml").write_text("train: [1, 2\n")
    (files / "list.yaml").write_text("- a\n- b\n")
    (files / "dup_section.yaml").write_text("method:\n  forget: ga\ntrain: {lr: 1.0e-5}\nmethod:\n  forget: npo\n")
    (files / "dup_nested.yaml").write_text("method:\n  forget: asu\n  forget_args:\n    tau: 2.0\n    tau: 3.0\n")
    return {"model": model, "world": write_world(small_world, root / "world"), "bad": bad, "text": text,
            "files": files, "pickle": pickle, "cfgonly": cfgonly}


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_clean_error(case: Case, ctx, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "notes.txt").write_text("the user's own files")
    monkeypatch.chdir(cwd)
    for key, value in case.env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    if case.before == "dir":
        (out / "sub").mkdir(parents=True)
        (out / "precious.txt").write_text("results")
        (out / "sub" / "w.bin").write_bytes(bytes(range(256)))
    elif case.before == "file":
        out.write_text("a file where the run would go")
    elif case.before == "model":
        shutil.copytree(ctx["model"], out / "model")
    names = {k: str(v) for k, v in ctx.items()} | {"out": str(out), "tmp": str(tmp_path)}
    args = [_fill(a, names) for a in case.args]
    watched = cwd if case.watch == "cwd" else out
    before, siblings = _tree(watched), sorted(p.name for p in watched.parent.iterdir())
    t0 = time.perf_counter()
    rc, stdout, err = _run(args, capsys)
    elapsed = time.perf_counter() - t0
    assert rc == 2, (rc, stdout, err)
    assert err.startswith("obliviate: error: ") and err.count("\n") == 1, err  # one line, no traceback
    assert _fill(case.expect, names) in err, err
    assert _tree(watched) == before and sorted(p.name for p in watched.parent.iterdir()) == siblings
    assert elapsed < 20, elapsed  # pre-flight errors never wait on training (or the network)
    if case.validate:
        assert args[0] == "unlearn"
        rc, _, verr = _run(["validate"] + args[1:], capsys)
        assert (rc, verr) == (2, err)  # the same single line
        assert _tree(watched) == before


def test_case_table_is_large_and_unique():
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)


def test_unreachable_hub_fails_within_seconds(ctx, tmp_path, monkeypatch, capsys):
    from obliviate import hub

    for key, value in UNREACHABLE.items():
        monkeypatch.delenv(key, raising=False) if value is None else monkeypatch.setenv(key, value)
    monkeypatch.setattr(hub, "_answers", {})
    t0 = time.perf_counter()
    rc, _, err = _run(["validate", "model.path=some-org/some-model", f"data.source={ctx['world']}",
                       "eval.enabled=false"], capsys)
    assert rc == 2 and "unreachable" in err and "HF_HUB_OFFLINE=1" in err
    assert time.perf_counter() - t0 < 5


def test_validate_accepts_what_unlearn_accepts(ctx, tmp_path, capsys):
    """The opt-in for unusual τ, in-range negative layers and a pre-existing empty output_dir pass validation."""
    (tmp_path / "empty").mkdir()
    args = ["validate", f"model.path={ctx['model']}", f"data.source={ctx['world']}", f"output_dir={tmp_path / 'empty'}",
            "method.forget_args={tau: 1, layers: [-1]}", "method.allow_unusual_tau=true"]
    rc, out, err = _run(args, capsys)
    assert rc == 0, err
    assert "valid (unlearn config):" in out and "2 layers" in out and "1 safetensors file" in out
    assert list((tmp_path / "empty").iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_overwriting_a_regular_file_leaves_no_temporaries(ctx, tmp_path, capsys):
    out = tmp_path / "run"
    out.write_text("an old file")
    rc, printed, err = _run(["unlearn", f"model.path={ctx['model']}", f"data.source={ctx['world']}",
                             "train.max_steps=1", "train.progress=false", "data.max_length=32", "eval.max_examples=2",
                             "eval.max_new_tokens=4", "eval.memorization=false", "overwrite=true", "method.forget=npo",
                             "method.retain=nll", "method.combine.rule=sago", f"output_dir={out}"], capsys)
    assert rc == 0, err
    assert out.is_dir() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no .run.old-* / .run.tmp-* left behind
    assert "npo+nll+sago" in (out / "report.md").read_text() and "npo+nll+sago" in printed  # the rule is in the label


def _atomic_write(target: Path, text: str, **kw) -> None:
    from obliviate.modeling.load import atomic_dir

    with atomic_dir(target, **kw) as d:
        (d / "new.txt").write_text(text)


def test_sigint_during_the_final_swap_keeps_a_complete_output(tmp_path, monkeypatch):
    target = tmp_path / "run"
    target.mkdir()
    (target / "old.txt").write_text("old")
    real_rename, calls = Path.rename, []

    def rename_then_interrupt(self, dst):
        result = real_rename(self, dst)
        calls.append(dst)
        if len(calls) == 1:  # old output moved aside, new one not yet in place: the worst moment
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(Path, "rename", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt, match="new content is complete"):
        _atomic_write(target, "new", overwrite=True)
    assert [p.name for p in target.iterdir()] == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failed_swap_puts_the_old_output_back(tmp_path, monkeypatch):
    target = tmp_path / "run"
    target.mkdir()
    (target / "old.txt").write_text("old")
    real_rename, failed = Path.rename, []

    def fail_once(self, dst):
        if Path(dst) == target and not failed:  # the new output cannot be moved in (the old one is aside)
            failed.append(dst)
            raise OSError(28, "No space left on device")
        return real_rename(self, dst)

    monkeypatch.setattr(Path, "rename", fail_once)
    with pytest.raises(OSError):
        _atomic_write(target, "new", overwrite=True)
    assert [p.name for p in target.iterdir()] == ["old.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o002, 0o775), (0o077, 0o700)])
def test_output_directories_follow_the_umask(umask, mode, tmp_path):
    old = os.umask(umask)
    try:
        _atomic_write(tmp_path / "run", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "run").stat().st_mode & 0o777 == mode


def test_labels_name_the_rule_and_help_config_lists_objective_keys(capsys):
    from obliviate.config import method_label

    assert method_label("npo", "nll", "sago") == "npo+nll+sago" and method_label("ga", "nll", "sum") == "ga+nll"
    assert method_label("ga", None) == "ga"
    assert main(["unlearn", "--help-config"]) == 0
    text = capsys.readouterr().out
    for key in ("method.forget_args.tau", "method.forget_args.layers", "method.forget_args.beta",
                "method.forget_args.reduction", "method.allow_unusual_tau"):
        assert key in text, key
    assert "[method.forget=asu]" in text and "[method.forget=npo]" in text


def test_config_errors_and_help_answer_without_importing_torch(tmp_path):
    """A real process: what is imported before the answer is the point."""
    code = ("import sys\nfrom obliviate.cli import main\n"
            "assert main(['unlearn', '--config', 'missing.yaml']) == 2\n"
            "assert main(['validate', 'train.lrr=1']) == 2\n"
            "assert main(['calibrate', 'layer_sets=[[]]']) == 2\n"
            "assert main(['demo', '--config', 'missing.yaml']) == 2\n"
            "try:\n    main(['unlearn', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
    assert res.stderr.count("obliviate: error: ") == 4 and "Traceback" not in res.stderr
