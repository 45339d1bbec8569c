"""Checkpoints of a training run: weights, optimizer, schedule, gradient-rule state, step, history.

Resuming is exact: the batch plan is a pure function of the seed, so the loop skips the micro-batches
already used, and the frozen θ0 (teacher/reference) is rebuilt from the starting model, not from the
checkpoint. Files are written to a temporary name and renamed, so a crash never leaves a torn one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from obliviate.errors import ObliviateError

FILE = "checkpoint.pt"


@dataclass
class Checkpointer:
    """Saves every `every` steps into `directory`; `load` restores the newest one (or returns 0)."""

    directory: Path
    every: int

    def due(self, step: int, steps: int) -> bool:
        return self.every > 0 and (step % self.every == 0) and step < steps

    def save(self, step: int, model: Any, optimizer: Any, scheduler: Any, rule_state: Any,
             history: list[dict[str, float]], accelerator: Any) -> None:
        """Write the state after `step` optimizer steps (main process only)."""
        accelerator.wait_for_everyone()
        if not accelerator.is_main_process:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        state = {"step": step, "model": accelerator.unwrap_model(model).state_dict(),
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "rule_state": rule_state.state_dict() if rule_state is not None else None, "history": history}
        tmp = self.directory / (FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.directory / FILE)

    def load(self, model: Any, optimizer: Any, scheduler: Any, rule_state: Any, accelerator: Any) -> tuple[int, list]:
        """Restore the saved state into the given objects; (step, history) — (0, []) if none exists."""
        path = self.directory / FILE
        if not path.is_file():
            return 0, []
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ObliviateError(f"cannot read checkpoint {path}: {exc}; delete it to start over") from None
        try:
            accelerator.unwrap_model(model).load_state_dict(state["model"])
        except RuntimeError as exc:
            raise ObliviateError(f"checkpoint {path} does not fit this model ({str(exc)[:200]}); "
                                 "resume with the same model.path and method, or delete the checkpoint") from None
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if rule_state is not None and state["rule_state"] is not None:
            rule_state.load_state_dict(state["rule_state"])
        return int(state["step"]), list(state["history"])
