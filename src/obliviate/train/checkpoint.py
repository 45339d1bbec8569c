"""Checkpoints of a training run: weights, optimizer, schedule, gradient-rule state, step, history, fingerprint.

Resuming is exact: the batch plan is a pure function of the seed, so the loop skips the micro-batches
already used, and the frozen θ0 (teacher/reference) is rebuilt from the starting model, not from the
checkpoint. A checkpoint is one file, written to a temporary name in the same directory, flushed to disk and
renamed over the old one (an atomic replace): a run killed at any moment (SIGKILL, Ctrl-C, power loss) leaves
the previous checkpoint or the new one, never a torn one. Ctrl-C or an error during the write removes the
temporary file; one left by SIGKILL is removed by the next run that uses the directory.

The checkpoint records the run's fingerprint (train/fingerprint.py): train.resume=auto resumes only a
checkpoint of the same run and otherwise raises CheckpointMismatchError listing what differs; never starts
fresh (the old checkpoint stays until the first new one replaces it); require also fails when there is none.

Weights and AdamW state are stored as FULL state dicts keyed by parameter name (torch.distributed.checkpoint's
`get_state_dict(full_state_dict=True)`), also under FSDP: every rank takes part in gathering the shards, rank 0
writes the one file; on resume every rank reads it (a directory all ranks see) and keeps its own shards. The same file
therefore resumes with or without FSDP and with another process count (tests). Checkpoints written before this
format (AdamW state keyed by index) still resume without FSDP.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from obliviate.errors import CheckpointMismatchError, ConfigError, ObliviateError
from obliviate.train.fingerprint import differences
from obliviate.train.fsdp import is_sharded

FILE = "checkpoint.pt"
TMP_GLOB = FILE + ".tmp*"
FORMAT = 2  # full state dicts keyed by parameter name (1: model.state_dict() + optimizer.state_dict())


def _torch_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's AcceleratedOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def _full_state(model: Any, optimizer: Any, accelerator: Any) -> tuple[dict, dict]:
    """Full model and optimizer state dicts by parameter name; collective under FSDP (rank 0 gets them, on CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    inner = model if is_sharded(model) else accelerator.unwrap_model(model)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(inner, _torch_optimizer(optimizer), options=opts)


def _set_full_state(model: Any, optimizer: Any, accelerator: Any, state: dict) -> None:
    """Load full state dicts that every rank read from the file (under FSDP each rank keeps its own shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    sharded = is_sharded(model)
    inner = model if sharded else accelerator.unwrap_model(model)
    # a plain model's own state dict is the full one (full_state_dict=True would also need optimizer state tensors)
    set_state_dict(inner, _torch_optimizer(optimizer), model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=sharded))


@dataclass
class Checkpointer:
    """Saves every `every` steps into `directory`; `load` restores the newest one (or returns 0)."""

    directory: Path
    every: int
    resume: str = "auto"
    fingerprint: dict[str, Any] | None = None
    step: int = field(default=0, init=False)  # the step the checkpoint on disk holds (0: none of this run)

    def due(self, step: int, steps: int) -> bool:
        return self.every > 0 and (step % self.every == 0) and step < steps

    def save(self, step: int, model: Any, optimizer: Any, scheduler: Any, rule_state: Any,
             history: list[dict[str, float]], accelerator: Any) -> None:
        """Write the state after `step` optimizer steps (gathered by every rank, written by rank 0), atomically."""
        accelerator.wait_for_everyone()
        self.step = step
        model_sd, optim_sd = _full_state(model, optimizer, accelerator)
        if not accelerator.is_main_process:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        state = {"format": FORMAT, "step": step, "model": model_sd,
                 "optimizer": optim_sd, "scheduler": scheduler.state_dict(),
                 "rule_state": rule_state.state_dict() if rule_state is not None else None, "history": history,
                 "fingerprint": self.fingerprint}
        tmp = self.directory / f"{FILE}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / FILE)
        except BaseException:  # Ctrl-C or a full disk mid-write: keep the old checkpoint, drop the partial one
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.directory)

    def load(self, model: Any, optimizer: Any, scheduler: Any, rule_state: Any, accelerator: Any) -> tuple[int, list]:
        """Restore the saved state into the given objects; (step, history) — (0, []) if none is resumed."""
        path = self.directory / FILE
        if accelerator.is_main_process and self.directory.is_dir():
            self._remove_stale()
        if self.resume == "never":
            return 0, []
        if not path.is_file():
            if self.resume == "require":
                raise ConfigError(f"train.resume=require, but {self.directory} holds no {FILE}; "
                                  "check train.checkpoint_dir, or set train.resume=auto to start a new run")
            return 0, []
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ObliviateError(f"cannot read checkpoint {path}: {exc}; delete it, or set train.resume=never "
                                 "to start over") from None
        self._check_fingerprint(path, state.get("fingerprint"))

        try:
            if state.get("format") == FORMAT:
                _set_full_state(model, optimizer, accelerator, state)
            elif is_sharded(model):
                raise ObliviateError(f"checkpoint {path} was written by an older obliviate, which FSDP cannot resume; "
                                     "resume it without train.fsdp, or set train.resume=never")
            else:
                accelerator.unwrap_model(model).load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ObliviateError(f"checkpoint {path} does not fit this model ({str(exc)[:200]}); "
                                 "resume with the same model.path and method, or set train.resume=never") from None
        scheduler.load_state_dict(state["scheduler"])
        if rule_state is not None and state["rule_state"] is not None:
            rule_state.load_state_dict(state["rule_state"])
        self.step = int(state["step"])
        return self.step, list(state["history"])

    def _check_fingerprint(self, path: Path, saved: dict[str, Any] | None) -> None:
        """A CheckpointMismatchError listing what differs, unless the checkpoint is this run's."""
        if self.fingerprint is None or saved == self.fingerprint:
            return
        fix = ("Resume with the same settings, set train.resume=never to start fresh (the old checkpoint is "
               "replaced when the first new one is written), or use another train.checkpoint_dir")
        if saved is None:
            raise CheckpointMismatchError(f"checkpoint {path} records no fingerprint of the run that wrote it "
                                          f"(an older obliviate), so it cannot be checked against this run. {fix}")
        diff = differences(saved, self.fingerprint)
        raise CheckpointMismatchError(f"checkpoint {path} was written by another run; what differs (checkpoint → "
                                      f"this run):\n  " + "\n  ".join(diff) + f"\n{fix}")

    def _remove_stale(self) -> None:
        """Temporary files of writes that a SIGKILL interrupted (never the newest complete checkpoint)."""
        for stale in self.directory.glob(TMP_GLOB):
            stale.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
