"""lm-evaluation-harness options the papers' tables need (few-shot count, limit, batch size, your own tasks), run
with lm-eval itself on a tiny model and a task defined here (skipped only where the lm-eval extra is not installed)."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval", reason="optional extra not installed: lm-eval")

from obliviate.eval.mcq import MCQItem, mcq_accuracy, run_lm_eval  # noqa: E402
from obliviate.modeling.tiny import tiny_llama, train_tokenizer  # noqa: E402

ITEMS = [MCQItem(f"Question {i}: which letter is {c}?", ("alpha", "beta", "gamma", "delta"), i % 4)
         for i, c in enumerate("abcdefgh")]
# lm-eval's wmdp template (tasks/wmdp/_default_template_yaml), on a local file, with a few-shot source
TASK = """task: obliviate_tiny_mcq
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\nC. {{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    data = d / "items.jsonl"
    data.write_text("".join(json.dumps({"question": it.question, "choices": list(it.choices), "answer": it.answer})
                            + "\n" for it in ITEMS))
    (d / "tiny_mcq.yaml").write_text(TASK.format(data=data))
    return d


@pytest.fixture(scope="module")
def tiny():
    tok = train_tokenizer([it.question + " " + " ".join(it.choices) + " A B C D Answer:" for it in ITEMS], vocab_size=300)
    return tiny_llama(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3).eval(), tok


def test_zero_shot_lm_eval_agrees_with_the_native_scorer_and_reports_what_it_ran(tiny, task_dir):
    model, tok = tiny
    got = run_lm_eval(model, tok, ["obliviate_tiny_mcq"], include_path=str(task_dir), batch_size=4)
    native = mcq_accuracy(model, tok, ITEMS, target="letter", batch_size=4, max_length=256)
    assert got["obliviate_tiny_mcq"] == pytest.approx(native["accuracy"])
    assert got["obliviate_tiny_mcq_n_shot"] == 0 and got["obliviate_tiny_mcq_n"] == len(ITEMS)


def test_the_mcq_evaluation_passes_few_shot_and_limit_and_checks_them(tiny, task_dir, tmp_path):
    from obliviate.config import McqEvalConfig
    from obliviate.errors import ConfigError, ObliviateError
    from obliviate.eval.runner import evaluate_mcq_run

    model, tok = tiny
    cfg = McqEvalConfig(lm_eval_tasks=["obliviate_tiny_mcq"], lm_eval_num_fewshot=2, lm_eval_limit=3,
                        lm_eval_batch_size=2, lm_eval_include_path=str(task_dir))
    out = evaluate_mcq_run(model, tok, cfg)  # few-shot count and limit reach lm-eval, which reports them back
    assert out["lm_eval_obliviate_tiny_mcq_n_shot"] == 2 and out["lm_eval_obliviate_tiny_mcq_n"] == 3
    assert out["lm_eval_obliviate_tiny_mcq_accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0)
    with pytest.raises(ConfigError, match="mcq.lm_eval_num_fewshot"):
        McqEvalConfig(lm_eval_num_fewshot=-1)
    with pytest.raises(ObliviateError, match="is not a folder of lm-eval task YAML files"):
        run_lm_eval(model, tok, ["x"], include_path=str(tmp_path / "none"))
