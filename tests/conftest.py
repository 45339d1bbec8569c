"""Test setup: one torch thread, the TOFU copy shipped in the package, and a tiny world trained once per session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

TOFU_DIR = Path(__file__).resolve().parents[1] / "src" / "obliviate" / "resources" / "tofu"  # data.source=tofu
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads; on a busy 2-core machine two threads stall (30 s vs 0.3 s measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tofu_dir() -> Path:
    """The shipped TOFU folder (it is part of the repository: a missing file is a failure, not a skip)."""
    assert (TOFU_DIR / "forget01.jsonl").is_file(), f"the shipped TOFU copy is missing at {TOFU_DIR}"
    return TOFU_DIR


@pytest.fixture(scope="session")
def real_model_cache(tmp_path_factory):
    """OBLIVIATE_CACHE in a temporary folder for the whole session, so the real SmolLM2 GGUF is dequantised once
    (~30 s) for every test that loads it, and nothing is written outside temporary folders."""
    before = os.environ.get("OBLIVIATE_CACHE")
    os.environ["OBLIVIATE_CACHE"] = str(tmp_path_factory.mktemp("obliviate-cache"))
    yield Path(os.environ["OBLIVIATE_CACHE"])
    if before is None:
        os.environ.pop("OBLIVIATE_CACHE", None)
    else:
        os.environ["OBLIVIATE_CACHE"] = before


@pytest.fixture(scope="session")
def rwku_source(tmp_path_factory) -> Path:
    """A folder in the layout of the hub's RWKU configs, 100 made-up targets (Person 0 .. Person 99): forget_target.json,
    train_original_passage.json (two passages each) and the five probe levels (one probe each)."""
    root = tmp_path_factory.mktemp("rwku-source")
    names = [f"Person {i}" for i in range(100)]

    def dump(name: str, records: list) -> None:
        (root / f"{name}.json").write_text(json.dumps(records), encoding="utf-8")

    dump("forget_target", [{"target": n, "intro": f"{n} is a made-up person."} for n in names])
    dump("train_original_passage", [{"subject": n, "text": f"{n} was born in town {i}. Part {k}."}
                                    for i, n in enumerate(names) for k in range(2)])
    for level in ("forget_level1", "forget_level2", "forget_level3", "neighbor_level1", "neighbor_level2"):
        dump(level, [{"query": f"Where was {n} born?", "answer": f"town {i}", "subject": n, "level": level[-1]}
                     for i, n in enumerate(names)])
    return root


@pytest.fixture(scope="session")
def small_world():
    """A 10-author synthetic world (forget10 = 1 author)."""
    from obliviate.data.synthetic import make_world

    return make_world(10, seed=1, forget_percents=(10,))


@pytest.fixture(scope="session")
def small_tok(small_world):
    from obliviate.data.synthetic import corpus_texts
    from obliviate.modeling.tiny import train_tokenizer

    return train_tokenizer(corpus_texts(small_world), vocab_size=512)


@pytest.fixture(scope="session")
def trained_small(small_world, small_tok):
    """A hidden-48, 2-layer Llama fine-tuned a little on the small world's full split (a few seconds)."""
    from obliviate.config import TrainConfig
    from obliviate.modeling.tiny import tiny_llama
    from obliviate.train.unlearn import finetune

    model = tiny_llama(small_tok, hidden_size=48, num_layers=2, num_heads=4, seed=0)
    cfg = TrainConfig(max_steps=60, batch_size=16, lr=5e-3, progress=False, weight_decay=0.0)
    finetune(model, small_tok, small_world.splits["full"], cfg, max_length=64)
    return model.eval()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, trained_small, small_tok):
    """The trained small model saved as a local model directory."""
    from obliviate.modeling.load import save_model

    d = tmp_path_factory.mktemp("m")
    save_model(d, trained_small, small_tok)
    return d


@pytest.fixture(scope="session")
def facts_file(tmp_path_factory, trained_small, small_tok, small_world):
    """Facts whose gold is the first word of the tiny model's own reply: known by construction."""
    from obliviate.eval.generate import generate_answers

    rows = small_world.splits["full"][:24]
    replies = generate_answers(trained_small, small_tok, [r.question for r in rows], max_new_tokens=8)
    path = tmp_path_factory.mktemp("f") / "facts.jsonl"
    lines = []
    for i, (r, reply) in enumerate(zip(rows, replies)):
        word = next((w for w in reply.split() if w.strip(".,").isalpha()), None)
        if word:
            lines.append({"id": f"f{i}", "family": "fam_a" if i % 3 == 0 else "fam_b", "entity": (r.author or "") if i % 2 == 0 else "",
                          "question": r.question, "answer": word.strip(".,"), "aliases": []})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.fixture
def plain_sgd(monkeypatch):
    """`unlearn` with plain SGD (lr 1, every trainable parameter) instead of AdamW: one step moves θ by exactly
    −.grad, so a test can compare the step with a gradient computed on its own."""
    import torch
    from transformers import get_scheduler

    from obliviate.train import unlearn as unlearn_mod

    def sgd(model, cfg, steps, warmup):
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        return opt, get_scheduler("constant", opt)

    monkeypatch.setattr(unlearn_mod, "make_optimizer", sgd)


# ---------------------------------------------------------------- skips: only for reasons a user's machine can have
# A test may skip only because an optional extra is not installed or a GPU is absent, and says so with one of these
# prefixes; any other skip (a missing file, a missing fixture) fails the run in pytest_sessionfinish, listed by name.
ALLOWED_SKIPS = ("optional extra not installed: ", "needs a GPU: ")
_BAD_SKIPS: list[str] = []


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _check_skip(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if not reason.startswith(ALLOWED_SKIPS):
            _BAD_SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report):
    _check_skip(report)


def pytest_collectreport(report):
    _check_skip(report)


def pytest_terminal_summary(terminalreporter):
    if _BAD_SKIPS:
        terminalreporter.section("skips with a reason that is not allowed", red=True)
        terminalreporter.write_line(f"allowed reasons start with one of {ALLOWED_SKIPS}")
        for line in _BAD_SKIPS:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    if _BAD_SKIPS and exitstatus == 0:
        session.exitstatus = 1
