"""`obliviate demo`: the offline synthetic demo (default) or, with `kind: knowledge` in its YAML, the real-model demo."""
from __future__ import annotations

import argparse

from obliviate.cli import configured
from obliviate.demos.offline import run_demo
from obliviate.setups.world import pin_cpu_kernels

HELP = "offline demo: synthetic world -> target/retain models -> ASU_KL vs GradDiff -> report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    configured.add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    cfg = configured.resolve(args)
    if cfg is None:
        return 0
    if getattr(cfg, "cpu_kernels", None) == "avx2":  # before torch loads
        pin_cpu_kernels()
    configured.quiet_libraries()
    if getattr(cfg, "kind", None) == "knowledge":
        from obliviate.demos.knowledge import run_knowledge_demo

        run_knowledge_demo(cfg)
    else:
        run_demo(cfg)
    return 0
