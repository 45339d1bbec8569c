"""`obliviate push` and `hub.push` in a run config, end to end on one tiny unlearn run, never touching the network:
the card of the run parses with huggingface_hub, --dry-run lists what would be sent, a real push goes through
huggingface_hub's HfApi (monkeypatched here), and bad input is one clear error."""
from __future__ import annotations

import json
import shutil

import huggingface_hub
import pytest
from huggingface_hub import ModelCard

from obliviate import hub
from obliviate.cli import main

RUN = ["--config", "configs/tofu/graddiff.yaml", "data.source=tofu", "data.forget_split=forget01",
       "data.retain_split=retain99", "data.max_length=64", "train.max_steps=1", "train.grad_accum=1",
       "train.progress=false", "eval.forget_split=forget01_perturbed", "eval.max_examples=2", "eval.max_new_tokens=4",
       "eval.batch_size=4"]


class Calls:
    """What HfApi was asked to do (the methods are replaced; nothing reaches the network)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.create_repo: list = []
        self.upload_folder: list = []
        self.create_branch: list = []
        monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                            lambda api, repo_id, **kw: self.create_repo.append((repo_id, kw)))
        monkeypatch.setattr(huggingface_hub.HfApi, "create_branch",
                            lambda api, repo_id, **kw: self.create_branch.append((repo_id, kw)))

        def upload(api, **kw):
            self.upload_folder.append(kw)
            return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{kw['repo_id']}/commit/abc",
                                              commit_message="m", commit_description="", oid="abc")

        monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload)


def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """A logged-in machine with the hub reachable, as far as obliviate's checks can tell."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(hub, "unreachable", lambda: None)


@pytest.fixture(scope="module")
def start_dir(small_tok, tmp_path_factory):
    """θ0: a tiny Llama whose own card names its base model and licence."""
    from obliviate.modeling.load import save_model
    from obliviate.modeling.tiny import tiny_llama

    out = tmp_path_factory.mktemp("start") / "model"
    save_model(out, tiny_llama(small_tok, hidden_size=32, num_layers=1, num_heads=4, seed=0), small_tok)
    (out / "README.md").write_text("---\nbase_model: HuggingFaceTB/SmolLM2-135M\nlicense: apache-2.0\n---\n# θ0\n")
    return out


@pytest.fixture(scope="module")
def pushed(start_dir, tmp_path_factory):
    """One unlearn run with hub.push=true (HfApi monkeypatched): (its output directory, the HfApi calls)."""
    out = tmp_path_factory.mktemp("runs") / "unlearned"
    with pytest.MonkeyPatch.context() as mp:
        online(mp)
        calls = Calls(mp)
        assert main(["unlearn", *RUN, f"model.path={start_dir}", f"eval.retain_model={start_dir}", f"output_dir={out}",
                     "hub.push=true", "hub.repo_id=me/tiny-forget01", "hub.private=true"]) == 0
    return out, calls


@pytest.fixture
def run_dir(pushed):
    return pushed[0]


def expected_files(run_dir):
    """Weights, every file the receipt records, and the receipt."""
    receipt = json.loads((run_dir / "receipt.json").read_text())
    return sorted({"model.safetensors", "receipt.json", *receipt["files"]})


def test_the_run_card_parses_with_huggingface_hub(run_dir):
    card = ModelCard.load(run_dir / "README.md")
    meta, results = card.data.to_dict(), {r.metric_type: r for r in card.data.eval_results}
    receipt = json.loads((run_dir / "receipt.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())["eval"]
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M" and meta["license"] == "apache-2.0"  # from θ0's card
    assert meta["datasets"] == ["locuslab/TOFU"] and meta["pipeline_tag"] == "text-generation"
    assert meta["tags"] == ["unlearning", "obliviate", "ga+nll", "ga"]
    assert meta["obliviate"]["final_weights_sha256"] == receipt["weights"]["final"]["sha256"]
    assert meta["obliviate"]["forget_rows_sha256"] == receipt["data"]["forget"]["sha256"]
    assert {"forget_quality", "model_utility", "forget_truth_ratio"} <= set(results)
    assert all(results[k].metric_value == pytest.approx(metrics[k]) for k in results)
    assert results["forget_truth_ratio"].dataset_config == "forget01_perturbed"
    assert results["forget_quality"].dataset_args == {"max_examples": 2}
    assert "40 rows" in card.text and "## How it was measured" in card.text


def test_hub_push_in_the_run_config_pushes_after_the_save(pushed):
    out, calls = pushed
    assert calls.create_repo == [("me/tiny-forget01", {"private": True, "repo_type": "model", "exist_ok": True})]
    (upload,) = calls.upload_folder
    assert upload["repo_id"] == "me/tiny-forget01" and upload["folder_path"] == str(out)
    assert sorted(upload["allow_patterns"]) == expected_files(out) and upload["revision"] is None
    assert calls.create_branch == []


def test_dry_run_lists_the_files_and_sizes_and_contacts_nothing(run_dir, monkeypatch, capsys):
    monkeypatch.setattr(hub, "unreachable", lambda: pytest.fail("--dry-run asked for the hub"))
    calls = Calls(monkeypatch)
    (run_dir / "notes.txt").write_text("not in the receipt")  # neither this nor a folder is sent
    (run_dir / "audit").mkdir(exist_ok=True)
    try:
        assert main(["push", str(run_dir), "--repo-id", "me/model", "--dry-run"]) == 0
    finally:
        (run_dir / "notes.txt").unlink()
        (run_dir / "audit").rmdir()
    out = capsys.readouterr().out
    listed = {line.split()[-1]: int(line.split()[0].replace(",", "")) for line in out.splitlines()[2:-1]}
    assert sorted(listed) == expected_files(run_dir)
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
            "receipt.json"} <= set(listed)
    assert all(size == (run_dir / name).stat().st_size for name, size in listed.items())
    assert out.startswith(f"{len(listed)} files, {sum(listed.values()):,} bytes, to hub model repository me/model")
    assert out.rstrip().endswith("dry run: nothing was sent")
    assert not (calls.create_repo or calls.upload_folder)


def test_push_uploads_with_huggingface_hub(run_dir, monkeypatch, capsys):
    online(monkeypatch)
    calls = Calls(monkeypatch)
    assert main(["push", str(run_dir), "--repo-id", "me/model", "--revision", "v1"]) == 0
    assert calls.create_repo == [("me/model", {"private": False, "repo_type": "model", "exist_ok": True})]
    assert calls.create_branch == [("me/model", {"branch": "v1", "repo_type": "model", "exist_ok": True})]
    (upload,) = calls.upload_folder
    assert (upload["repo_id"], upload["revision"]) == ("me/model", "v1")
    assert sorted(upload["allow_patterns"]) == expected_files(run_dir)
    assert "pushed to me/model: https://huggingface.co/me/model/commit/abc" in capsys.readouterr().out


def _fails(args, capsys, *messages):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("obliviate: error:") and err.count("\n") == 1, err
    for m in messages:
        assert m in err, err
    return err


def test_push_refuses_offline_or_without_a_token_before_sending(run_dir, monkeypatch, capsys):
    calls = Calls(monkeypatch)
    _fails(["push", str(run_dir), "--repo-id", "me/model"], capsys, "offline mode is set")  # tests run offline
    online(monkeypatch)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    _fails(["push", str(run_dir), "--repo-id", "me/model"], capsys, "no Hugging Face token", "HF_TOKEN")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test")
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda api, **kw: 1 / 0)
    _fails(["push", str(run_dir), "--repo-id", "me/model"], capsys, "the push to me/model failed: ZeroDivisionError")
    assert not calls.upload_folder


def test_bad_run_directories_and_repo_ids_are_one_clear_error(run_dir, start_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(["push", str(empty), "--repo-id", "me/m", "--dry-run"], capsys,
           "is not an unlearned run directory: it has no config.json (or adapter_config.json), no *.safetensors "
           "weights, no README.md model card, no receipt.json")
    _fails(["push", str(start_dir), "--repo-id", "me/m", "--dry-run"], capsys, "it has no receipt.json")
    _fails(["push", str(tmp_path / "nope"), "--repo-id", "me/m", "--dry-run"], capsys, "not found")
    broken = shutil.copytree(run_dir, tmp_path / "broken")
    (broken / "tokenizer.json").unlink()
    _fails(["push", str(broken), "--repo-id", "me/m", "--dry-run"], capsys, "recorded in its receipt are missing: "
           "tokenizer.json", "obliviate verify")
    for bad in ("model", "a/b/c", "../x", "me/", "me/model name"):
        _fails(["push", str(run_dir), "--repo-id", bad, "--dry-run"], capsys, f"--repo-id {bad!r} is not a "
               "repository id: it must be owner/name")


def test_hub_push_without_a_repo_id_is_a_config_error(start_dir, tmp_path, capsys):
    out = tmp_path / "never"
    base = ["unlearn", *RUN, f"model.path={start_dir}", f"eval.retain_model={start_dir}", f"output_dir={out}"]
    _fails(base + ["hub.push=true"], capsys, "hub.repo_id=None is impossible", "when hub.push is true")
    _fails(base + ["hub.push=true", "hub.repo_id=model"], capsys, "hub.repo_id='model' is impossible", "owner/name")
    _fails(base + ["hub.push=true", "hub.repo_id=me/m"], capsys, "offline mode is set")  # before any training
    validate = ["validate", *base[1:], "hub.push=true", "hub.repo_id=me/m"]
    _fails(validate, capsys, "offline mode is set")  # validate checks it the same way
    assert not out.exists()
