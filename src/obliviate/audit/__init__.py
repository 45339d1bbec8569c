"""`obliviate audit`: try to bring forgotten knowledge back (relearning, quantisation, indirect prompts,
membership inference) and say per attack how much came back.

Importing this package loads no torch: run_audit and audit_from_config import their modules when called.
"""
from __future__ import annotations

from typing import Any

from obliviate.audit import run
from obliviate.audit.verdict import AttackRow, recovered_share
from obliviate.config.audit import ATTACKS, AuditConfig

__all__ = ["ATTACKS", "AttackRow", "AuditConfig", "AuditResult", "audit_from_config", "recovered_share", "run_audit"]


def __getattr__(name: str) -> Any:
    """AuditResult / run_audit / audit_from_config on first use (they import torch)."""
    if name in ("AuditResult", "run_audit"):
        from obliviate.audit import core

        return getattr(core, name)
    if name in ("audit_from_config", "audit_run_output"):
        return getattr(run, name)
    raise AttributeError(f"module 'obliviate.audit' has no attribute {name!r}")
