"""The offline demo's own checks: the claims it prints about its results, and the CPU-kernel pin that makes two
x86-64 machines print the same digits."""
from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from obliviate.demos.offline import demo_claims
from obliviate.setups.world import AVX2_KERNELS


def _runs(**over):
    """Results shaped like the demo's, at values that make every claim hold; `over` edits one metric."""
    m = {"retain": {"forget_fact_recall": 0.0, "model_utility": 0.75, "forget_degenerate_share": 0.0},
         "target": {"forget_fact_recall": 0.95, "model_utility": 0.81, "forget_degenerate_share": 0.0},
         "ASU_KL": {"forget_fact_recall": 0.30, "model_utility": 0.79, "forget_degenerate_share": 0.0,
                    "forget_token_entropy": 0.97},
         "GradDiff": {"forget_fact_recall": 0.0, "model_utility": 0.60, "forget_degenerate_share": 0.9,
                      "forget_token_entropy": 0.9}}
    for key, value in over.items():
        model, metric = key.split("__")
        m[model][metric] = value
    return {name: {"metrics": metrics} for name, metrics in m.items()}


def test_every_claim_holds_on_results_that_tell_the_story():
    assert [ok for _, ok in demo_claims(_runs())] == [True, True, True]


@pytest.mark.parametrize("edit, broken", [
    ({"target__forget_fact_recall": 0.79}, 0),   # the target must know >= 80%
    ({"retain__forget_fact_recall": 0.11}, 0),   # the retain model <= 10%
    ({"ASU_KL__forget_fact_recall": 0.58}, 1),   # ASU_KL keeps <= 60% of the target's 0.95 = 0.57
    ({"ASU_KL__model_utility": 0.759}, 1),       # utility within 0.05 of the target's 0.81
    ({"ASU_KL__forget_degenerate_share": 0.11}, 1),  # <= 10% degenerate
    ({"ASU_KL__forget_token_entropy": 0.89}, 1),     # token entropy >= 0.9
    ({"GradDiff__forget_fact_recall": 0.06}, 2),     # GradDiff <= 5% recall
    ({"GradDiff__forget_degenerate_share": 0.49}, 2),  # broken: >= 50% degenerate (entropy 0.9 is fluent) ...
    ({"GradDiff__model_utility": 0.79}, 2),          # strictly below ASU_KL's utility
])
def test_each_threshold_breaks_its_own_claim(edit, broken):
    holds = [ok for _, ok in demo_claims(_runs(**edit))]
    assert holds == [i != broken for i in range(3)]


@pytest.mark.parametrize("entropy, holds", [(0.75, True), (0.76, False)])
def test_answers_without_repeated_words_count_as_broken_by_their_token_entropy(entropy, holds):
    """... or token entropy <= 0.75 ("sssssau": one word, not degenerate by the word rule)."""
    runs = _runs(GradDiff__forget_degenerate_share=0.07, GradDiff__forget_token_entropy=entropy)
    assert demo_claims(runs)[2][1] is holds


def test_a_metric_the_run_could_not_compute_fails_its_claim():
    assert [ok for _, ok in demo_claims(_runs(ASU_KL__forget_fact_recall=None))] == [True, False, True]


def test_claims_about_models_the_run_lacks_are_left_out():
    runs = _runs()
    del runs["GradDiff"]
    assert [c for c, _ in demo_claims(runs)] == ["the target knows the forget facts and the retain model does not",
                                                 "ASU_KL forgets facts, keeps model utility and fluent answers"]


def test_the_pin_sets_avx2_kernels_before_torch_loads_and_keeps_the_users_own():
    code = ("import json, os; from obliviate.setups.world import pin_cpu_kernels; ok = pin_cpu_kernels(); import torch; "
            "print(json.dumps([ok, torch.backends.cpu.get_cpu_capability(), {k: os.environ.get(k) for k in "
            "('ATEN_CPU_CAPABILITY', 'MKL_CBWR', 'DNNL_MAX_CPU_ISA')}]))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in AVX2_KERNELS}
    ok, capability, seen = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                                     text=True, check=True, timeout=120).stdout)
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert ok and seen == AVX2_KERNELS and capability in ("AVX2", "DEFAULT")  # DEFAULT: a CPU without AVX2
    else:
        assert not ok and seen == dict.fromkeys(AVX2_KERNELS)
    env["MKL_CBWR"] = "COMPATIBLE"  # the user's own setting wins
    seen = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True, timeout=120).stdout)[2]
    assert seen["MKL_CBWR"] == "COMPATIBLE"


def test_the_pin_cannot_act_once_torch_is_loaded(monkeypatch):
    import torch  # noqa: F401  (loaded, as in this test process)

    from obliviate.setups.world import pin_cpu_kernels

    for key in AVX2_KERNELS:
        monkeypatch.delenv(key, raising=False)
    assert pin_cpu_kernels() is False
    assert all(k not in __import__("os").environ for k in AVX2_KERNELS)


@pytest.mark.parametrize("base, declared, licence", [
    (None, None, None),  # the tiny model is trained from scratch: nothing to declare
    ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
    ("my-org/base-7b", "my-org/base-7b", None),  # a hub id not in the cache: its licence is unknown here
])
def test_the_demo_cards_declare_the_base_model_the_demo_started_from(base, declared, licence):
    from obliviate.demos.offline import card_base
    from obliviate.setups.world import DemoConfig

    facts = card_base(DemoConfig(base_model=base))
    assert (facts.base_model, facts.license) == (declared, licence)
    assert ("from scratch" in facts.note) is (base is None) and ("models/target" in facts.note)
