"""LoRA students: θ0 = the student with adapters off (no copy), base weights untouched, merged saves."""
import copy
import json

import pytest
import torch

from obliviate.config import MethodConfig, TrainConfig
from obliviate.data.tokenize import collate, pad_id
from obliviate.modeling.frozen import FrozenModels, frozen_copy
from obliviate.modeling.lora import apply_lora
from obliviate.modeling.teacher import Teacher
from obliviate.train.unlearn import encode_rows, unlearn

pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")


def test_lora_teacher_and_reference_equal_a_frozen_copy_without_copying(small_tok, small_world, trained_small):
    base = copy.deepcopy(trained_small)
    student = apply_lora(copy.deepcopy(trained_small), r=4, alpha=8, dropout=0.0, target_modules=None)
    shared = FrozenModels(student, Teacher(4.0, (0,)))
    copied = FrozenModels(base, Teacher(4.0, (0,)))
    assert shared.model is student and copied.model is not base
    batch = collate(encode_rows(small_tok, small_world.splits["forget10"][:4], 64), pad_id(small_tok))
    torch.testing.assert_close(shared.teacher_stats(batch).logits, copied.teacher_stats(batch).logits)
    torch.testing.assert_close(shared.reference_stats(batch).logits, copied.reference_stats(batch).logits)


def test_lora_unlearning_trains_adapters_only(small_tok, small_world, trained_small):
    student = apply_lora(copy.deepcopy(trained_small), r=4, alpha=8, dropout=0.0, target_modules=None)
    before = {n: p.clone() for n, p in student.named_parameters()}
    unlearn(student, small_tok, small_world.splits["forget10"], small_world.splits["retain90"],
            MethodConfig(forget="asu", forget_args={"tau": 4.0, "layers": [0]}, retain="kl"),
            TrainConfig(max_steps=3, batch_size=4, lr=5e-3, progress=False), max_length=64)
    changed = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    reference = frozen_copy(trained_small)
    batch = collate(encode_rows(small_tok, small_world.splits["forget10"][:2], 64), pad_id(small_tok))
    with student.disable_adapter(), torch.no_grad():  # θ0 is still the untouched base model
        torch.testing.assert_close(student(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits,
                                   reference(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits)


def test_cli_lora_run_saves_a_merged_plain_model(tmp_path, small_tok, small_world, trained_small):
    from transformers import AutoModelForCausalLM

    from obliviate.cli import main
    from obliviate.data.synthetic import write_world

    model_dir, world = tmp_path / "m", write_world(small_world, tmp_path / "w")
    trained_small.save_pretrained(model_dir)
    small_tok.save_pretrained(model_dir)
    out = tmp_path / "out"
    assert main(["unlearn", "--config", "configs/synthetic/asu_kl.yaml", f"model.path={model_dir}",
                 "model.lora.enabled=true", "model.lora.r=2", f"data.source={world}", "data.max_length=48",
                 "train.max_steps=2", "train.lr=1e-2", "train.progress=false", "eval.enabled=false",
                 f"output_dir={out}"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out)  # no peft needed to load it
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(merged.parameters(), trained_small.parameters()))
    assert json.loads((out / "metrics.json").read_text())["history"]
