"""Fixtures the sweep tests share."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture
def unlearn_base(model_dir, small_world, tmp_path):
    """A factory: an unlearn run config written to tmp_path/run.yaml (NPO + NLL on the synthetic world's forget10,
    the tiny model as θ0 and as its own retain model); the path. Tests vary the steps and the evaluation's size."""
    from obliviate.data.synthetic import write_world

    def make(max_steps: int = 2, max_examples: int = 2, max_new_tokens: int = 4) -> Path:
        world = write_world(small_world, tmp_path / "world")
        base = tmp_path / "run.yaml"
        base.write_text(yaml.safe_dump({
            "model": {"path": str(model_dir)}, "data": {"source": str(world), "forget_split": "forget10",
                                                       "retain_split": "retain90", "max_length": 64},
            "method": {"forget": "npo", "retain": "nll"},
            "train": {"max_steps": max_steps, "batch_size": 2, "progress": False},
            "eval": {"forget_split": "forget10_perturbed", "retain_model": str(model_dir),
                     "max_examples": max_examples, "max_new_tokens": max_new_tokens, "holdout_split": None},
            "output_dir": "ignored"}))
        return base

    return make


@pytest.fixture(scope="module")
def base_file(tmp_path_factory, model_dir, facts_file):
    """A knowledge demo config on the tiny model: forget fam_a, two methods."""
    raw = {"kind": "knowledge", "model": {"path": str(model_dir)},
           "knowledge": {"facts": str(facts_file), "forget_families": ["fam_a"], "max_new_tokens": 8, "batch_size": 8,
                         "max_eval": 4},
           "max_length": 64, "unlearn": {"max_steps": 4, "batch_size": 2, "lr": 1e-3, "progress": False},
           "methods": {"GradDiff": {"forget": "ga", "retain": "nll"}, "NPO": {"forget": "npo", "retain": "nll"}}}
    path = tmp_path_factory.mktemp("base") / "base.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
