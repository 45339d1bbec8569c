"""Kernel fingerprints (sweep/machine.py): a study records the CPU kernels its target was fine-tuned with, and a later
machine is given the environment that reproduces them, or told before its fine-tunes that none does."""
from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from obliviate.errors import ObliviateError
from obliviate.modeling.load import load_model
from obliviate.sweep import machine
from obliviate.sweep.workers import model_digests

optuna.logging.set_verbosity(optuna.logging.WARNING)
AMD = [{"fingerprint": "b" * 64, "cpu": "AMD EPYC 9R14", "env": {}}]


def _db(tmp_path: Path, attrs: dict, name: str = "sweep.db") -> str:
    """A storage of two studies, each with `attrs` as its user attributes; its path."""
    db = tmp_path / name
    for study_name in ("sweep/NPO", "sweep/RMU"):
        study = optuna.create_study(study_name=study_name, storage=f"sqlite:///{db}")
        for k, v in attrs.items():
            study.set_user_attr(k, v)
    return str(db)


def _attrs(db: str) -> list[dict]:
    return [optuna.load_study(study_name=n, storage=f"sqlite:///{db}").user_attrs for n in ("sweep/NPO", "sweep/RMU")]


def test_the_environment_whose_fingerprint_the_study_records_is_exported(tmp_path, monkeypatch):
    db = _db(tmp_path, {"kernels": [{"fingerprint": "d" * 64, "cpu": "Intel Xeon", "env": {}}, *AMD]})
    seen: list[dict] = []
    monkeypatch.setattr(machine, "probe", lambda env: seen.append(dict(env)) or ("b" * 64 if env else "a" * 64))
    assert machine.env_lines(db) == "export MKL_ENABLE_INSTRUCTIONS=AVX2\n"
    assert seen == [{}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}]  # native first
    monkeypatch.setattr(machine, "probe", lambda env: "b" * 64)
    assert machine.env_lines(db) == ""  # native kernels are the study's: nothing to export
    # a study of its own without kernels (a transfer of the same target) takes those of the study it shares it with
    own = _db(tmp_path, {}, "own.db")
    assert machine.env_lines(own) == "" and machine.env_lines(own, db, db) == ""
    monkeypatch.setattr(machine, "probe", lambda env: "b" * 64 if env else "a" * 64)
    assert machine.env_lines(own, db) == "export MKL_ENABLE_INSTRUCTIONS=AVX2\n"


def test_a_machine_no_known_setting_matches_is_told_before_its_fine_tunes(tmp_path, monkeypatch):
    db = _db(tmp_path, {"kernels": AMD})
    monkeypatch.setattr(machine, "probe", lambda env: "c" * 64)
    monkeypatch.setattr(machine, "cpu_name", lambda: "Intel(R) Xeon(R) Processor")
    with pytest.raises(ObliviateError) as err:
        machine.env_lines(db)
    msg = str(err.value)
    assert "AMD EPYC 9R14, fingerprint bbbbbbbbbbbb" in msg and "Intel(R) Xeon(R) Processor, cccccccccccc" in msg
    assert "start a new study" in msg


def test_before_the_studys_own_kernels_are_recorded_those_seen_giving_other_weights_are_avoided(tmp_path, monkeypatch):
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    native = {"fingerprint": "a" * 64, "cpu": "Intel Xeon", "env": {}, "weights": "7" * 64}
    db = _db(tmp_path, {"kernels_other": [native]})
    monkeypatch.setattr(machine, "probe", lambda env: "c" * 64 if env else "a" * 64)
    assert machine.env_lines(db) == "export MKL_ENABLE_INSTRUCTIONS=AVX2\n"  # not seen yet: worth a fine-tune
    monkeypatch.setattr(machine, "probe", lambda env: "d" * 64)
    assert machine.env_lines(db) == ""  # native kernels not seen giving other weights
    both = _db(tmp_path, {"kernels_other": [native, {**native, "fingerprint": "c" * 64}]}, "both.db")
    monkeypatch.setattr(machine, "probe", lambda env: "c" * 64 if env else "a" * 64)
    with pytest.raises(ObliviateError, match="every known setting here was seen fine-tuning other weights"):
        machine.env_lines(both)


def test_without_a_recorded_fingerprint_nothing_is_probed_or_written(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "probe", lambda env: pytest.fail("probed"))
    assert machine.env_lines(_db(tmp_path, {"models": {"original": "0" * 64}})) == ""
    assert machine.env_lines(str(tmp_path / "none.db")) == "" and not (tmp_path / "none.db").exists()


def test_the_kernels_are_recorded_once_the_targets_weights_are_the_studys(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(machine, "fingerprint", lambda: "f" * 64)
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    digest = model_digests(load_model(str(model_dir)))["original"]
    db = _db(tmp_path, {"models": {"original": digest}})
    assert machine.record(db, str(model_dir)).endswith(": recorded in 2 studies")
    mine = {"fingerprint": "f" * 64, "cpu": machine.cpu_name(), "env": {}}
    assert [a["kernels"] for a in _attrs(db)] == [[mine]] * 2
    assert machine.record(db, str(model_dir)).endswith(": recorded already")  # each fingerprint once
    # another kind of machine that fine-tunes the same weights adds its own
    monkeypatch.setattr(machine, "fingerprint", lambda: "e" * 64)
    assert machine.record(db, str(model_dir)).endswith(": recorded in 2 studies")
    assert [[k["fingerprint"] for k in a["kernels"]] for a in _attrs(db)] == [["f" * 64, "e" * 64]] * 2
    # the environment that reproduced them is recorded with them
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    fresh = _db(tmp_path, {"models": {"original": digest}}, "fresh.db")
    machine.record(fresh, str(model_dir))
    assert _attrs(fresh)[0]["kernels"][0]["env"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_a_target_with_other_weights_is_refused_and_nothing_recorded(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(machine, "fingerprint", lambda: "f" * 64)
    db = _db(tmp_path, {"models": {"original": "0" * 64}, "kernels": AMD})
    with pytest.raises(ObliviateError) as err:
        machine.record(db, str(model_dir))
    assert "are not those the study" in str(err.value) and "000000000000" in str(err.value)
    assert "AMD EPYC 9R14, fingerprint bbbbbbbbbbbb" in str(err.value)
    assert [a["kernels"] for a in _attrs(db)] == [AMD, AMD]
    seen = {"fingerprint": "f" * 64, "cpu": machine.cpu_name(), "env": {}, "weights": model_digests(
        load_model(str(model_dir)))["original"]}
    assert [a["kernels_other"] for a in _attrs(db)] == [[seen]] * 2  # so the next such machine stops earlier
    assert "no study in" in machine.record(str(tmp_path / "none.db"), str(model_dir))
    assert not (tmp_path / "none.db").exists()


def test_a_retain_model_is_checked_against_the_one_the_study_was_measured_against(tmp_path, model_dir):
    """The audits' 0% reference (REF0=retain) is the study's retain model or nothing: its digest is the workers'."""
    model = load_model(str(model_dir))
    digest = model_digests(model, model)["retain"]
    ok = _db(tmp_path, {"models": {"original": "0" * 64, "retain": digest}})
    assert machine.check_retain(ok, str(model_dir)) == f"{model_dir}: the study's retain model ({digest[:12]})"
    other = _db(tmp_path, {"models": {"original": "0" * 64, "retain": "1" * 64}}, "other.db")
    with pytest.raises(ObliviateError, match=r"are not the retain model the study .* \(111111111111\)"):
        machine.check_retain(other, str(model_dir))
    none = _db(tmp_path, {"models": {"original": digest}}, "none.db")  # the θ0 digest is not the retain model's
    with pytest.raises(ObliviateError, match="records no retain model's weights"):
        machine.check_retain(none, str(model_dir))
    with pytest.raises(ObliviateError, match="no study in"):
        machine.check_retain(str(tmp_path / "absent.db"), str(model_dir))
    assert not (tmp_path / "absent.db").exists()
    assert machine.main(["retain", other, str(model_dir)]) == 3 and machine.main(["retain", ok]) == 2


def test_the_command_line_exits_2_on_usage_and_3_on_a_refusal(tmp_path, monkeypatch, capsys):
    assert machine.main([]) == 2 and "usage: python -m obliviate.sweep.machine" in capsys.readouterr().err
    assert machine.main(["env"]) == 2
    monkeypatch.setattr(machine, "probe", lambda env: "c" * 64)
    assert machine.main(["env", _db(tmp_path, {"kernels": AMD})]) == 3
    assert "obliviate: error: this machine's CPU kernels round differently" in capsys.readouterr().err


def test_the_fingerprint_sees_the_vectorised_kernels():
    """AVX2 ATen kernels round the norm, SiLU and AdamW otherwise than AVX-512 ones: the fingerprint covers them, not
    only the matrix products (on an AVX-512 machine; others cannot run both)."""
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("needs a CPU with AVX-512")
    native = machine.probe({"OMP_NUM_THREADS": "1"})
    assert len(native) == 64 and native != machine.probe({"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"})
