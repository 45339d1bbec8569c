"""bitsandbytes' memory switches: train.optimizer (8-bit / paged AdamW) and model.load_in_4bit (QLoRA). Refused with
the key and the fix on a machine that cannot run them (no bitsandbytes, no CUDA GPU), in `validate` as in the run;
run for real where a GPU is present."""
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from obliviate.cli import main
from obliviate.config import LoraSettings, ModelConfig, TrainConfig
from obliviate.errors import ConfigError
from obliviate.train import optim
from obliviate.train.switches import check_memory_switches

HAS_GPU_BNB = torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes") is not None


@pytest.fixture
def no_bitsandbytes(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))


@pytest.fixture
def bitsandbytes_without_gpu(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: SimpleNamespace(name=name) if name == "bitsandbytes" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_settings_that_cannot_work_together_are_config_errors():
    with pytest.raises(ConfigError, match="train.optimizer='adam8' is impossible: it must be one of adamw, adamw_8bit"):
        TrainConfig(optimizer="adam8")
    with pytest.raises(ConfigError, match="adamw with train.fsdp"):
        TrainConfig(optimizer="paged_adamw_8bit", fsdp=True)
    with pytest.raises(ConfigError, match="model.lora.enabled=False is impossible: it must be true with model.load_in_4bit"):
        ModelConfig(load_in_4bit=True)
    with pytest.raises(ConfigError, match="model.lora.merge_on_save=True is impossible: it must be false"):
        ModelConfig(load_in_4bit=True, lora=LoraSettings(enabled=True))
    ModelConfig(load_in_4bit=True, lora=LoraSettings(enabled=True, merge_on_save=False))  # QLoRA as it should be


@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw", "paged_adamw_8bit"])
def test_bitsandbytes_optimizers_without_the_package_name_the_install(name, no_bitsandbytes):
    with pytest.raises(ConfigError, match=f"train.optimizer={name} needs bitsandbytes: pip install bitsandbytes "
                                          r"\(or use train.optimizer=adamw\)"):
        optim.optimizer_class(name)


def test_bitsandbytes_switches_without_a_gpu_say_so(bitsandbytes_without_gpu):
    with pytest.raises(ConfigError, match="train.optimizer=adamw_8bit runs on a CUDA GPU only .* use train.optimizer=adamw"):
        check_memory_switches(TrainConfig(optimizer="adamw_8bit"))
    qlora = ModelConfig(load_in_4bit=True, lora=LoraSettings(enabled=True, merge_on_save=False))
    with pytest.raises(ConfigError, match=r"model.load_in_4bit=true \(QLoRA\) runs on a CUDA GPU only .* set "
                                          "model.load_in_4bit=false"):
        check_memory_switches(TrainConfig(), qlora)
    assert check_memory_switches(TrainConfig()) == []  # torch's AdamW needs nothing


def test_torch_adamw_is_the_default_optimizer(trained_small):
    opt, _ = optim.make_optimizer(trained_small, TrainConfig(), steps=1, warmup=0)
    assert type(opt) is torch.optim.AdamW


def test_validate_and_unlearn_refuse_before_loading_anything(no_bitsandbytes, model_dir, tofu_dir, tmp_path, capsys):
    base = [f"model.path={model_dir}", f"data.source={tofu_dir}", "data.forget_split=forget01",
            "data.retain_split=retain99", "eval.enabled=false"]
    for command in ("validate", "unlearn"):
        out = tmp_path / command
        assert main([command, *base, "train.optimizer=paged_adamw", f"output_dir={out}"]) == 2
        err = capsys.readouterr().err
        assert "train.optimizer=paged_adamw needs bitsandbytes: pip install bitsandbytes" in err
        assert not out.exists()
    qlora = ["model.lora.enabled=true", "model.lora.merge_on_save=false", "model.load_in_4bit=true"]
    assert main(["validate", *base, *qlora]) == 2
    assert "model.load_in_4bit=true (QLoRA) needs bitsandbytes" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_GPU_BNB, reason="needs a GPU: bitsandbytes' 8-bit optimizers and 4-bit weights run on CUDA")
@pytest.mark.parametrize("name", ["adamw_8bit", "paged_adamw_8bit"])
def test_an_8bit_optimizer_takes_a_real_step_on_the_gpu(name, trained_small, small_world, small_tok):
    import copy

    from obliviate.config import MethodConfig
    from obliviate.train.unlearn import unlearn

    model = copy.deepcopy(trained_small).cuda()
    before = [p.detach().clone() for p in model.parameters()]
    unlearn(model, small_tok, small_world.splits["forget10"][:4], small_world.splits["retain90"][:4],
            MethodConfig(forget="npo", retain="nll"),
            TrainConfig(max_steps=2, batch_size=4, lr=1e-3, progress=False, optimizer=name), max_length=64)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.skipif(not HAS_GPU_BNB, reason="needs a GPU: bitsandbytes' 8-bit optimizers and 4-bit weights run on CUDA")
def test_qlora_trains_adapters_over_a_4bit_base_and_theta0_is_the_adapters_off(model_dir, small_world):
    from obliviate.config import MethodConfig
    from obliviate.train.student import load_model
    from obliviate.train.unlearn import unlearn

    mc = ModelConfig(path=str(model_dir), load_in_4bit=True, lora=LoraSettings(enabled=True, merge_on_save=False))
    model, tok = load_model(mc)
    assert any("4bit" in type(m).__name__ for m in model.modules())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    unlearn(model, tok, small_world.splits["forget10"][:4], small_world.splits["retain90"][:4],
            MethodConfig(forget="asu", retain="kl", forget_args={"tau": 4.0, "layers": [0]}),
            TrainConfig(max_steps=2, batch_size=4, lr=1e-3, progress=False), max_length=64)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)


def test_finetune_checks_the_switches_too(no_bitsandbytes, tofu_dir, tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["finetune", "model.path=tiny", f"data.source={tofu_dir}", "data.splits=[forget01]",
                 "train.optimizer=adamw_8bit", f"output_dir={out}"]) == 2
    assert "train.optimizer=adamw_8bit needs bitsandbytes" in capsys.readouterr().err and not out.exists()


def test_a_cache_dir_that_cannot_be_written_is_refused_before_training(model_dir, tofu_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = tmp_path / "never"
    args = [f"model.path={model_dir}", f"data.source={tofu_dir}", "data.forget_split=forget01",
            "data.retain_split=retain99", "eval.enabled=false", f"method.cache_dir={blocker}", f"output_dir={out}"]
    for command in ("validate", "unlearn"):
        assert main([command, *args]) == 2
        assert "method.cache_dir" in capsys.readouterr().err
    assert not out.exists()
