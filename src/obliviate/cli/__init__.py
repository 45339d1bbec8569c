"""Command line: `obliviate COMMAND ...`, one module per command in this package and one dispatch table.

Each command module has HELP (and optionally DESCRIPTION), `add_arguments(parser)` and `run(args) -> exit status`,
and imports torch only inside `run`. User errors (bad data, config, paths) print one clear message and exit with
status 2; no partial output directory is left behind (runs write into a temporary directory renamed at the end).

Room `cli`, the top floor: it may import any other room, and no other room imports it.
"""
from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import NoReturn, Sequence

from obliviate.cli import (
    audit,
    calibrate,
    compare,
    demo,
    finetune,
    ls,
    prepare,
    push,
    report,
    reproduce,
    sweep,
    unlearn,
    validate,
    verify,
)
from obliviate.cli import eval as eval_command
from obliviate.errors import ObliviateError

COMMANDS: dict[str, ModuleType] = {  # the one dispatch table, in the order of `obliviate --help`
    "demo": demo, "finetune": finetune, "unlearn": unlearn, "eval": eval_command, "calibrate": calibrate,
    "sweep": sweep, "validate": validate, "ls": ls, "compare": compare, "report": report, "audit": audit,
    "verify": verify, "push": push, "reproduce": reproduce, "prepare": prepare,
}


def parser() -> argparse.ArgumentParser:
    """The `obliviate` argument parser: one sub-parser per entry of COMMANDS."""
    p = argparse.ArgumentParser(prog="obliviate", description="Make a causal LM forget chosen data, and prove it.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        sp = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP))
        module.add_arguments(sp)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `obliviate` console script; under torchrun every rank leaves through
    `train.loop.end_process`, which never returns (see there why)."""
    rc = _main(parser().parse_args(argv))
    if "torch.distributed" in sys.modules:  # never imports torch for a light command
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from obliviate.train.loop import end_process

            end_process(rc)
    return rc


def entry() -> NoReturn:
    """The `obliviate` console script and `python -m obliviate.cli`: `main`, then, once torch is loaded, leave
    without the interpreter's finalisation: tearing down torch's and transformers' modules takes 1-2 s after every
    command (measured: `obliviate eval` of a tiny model, 19.4 s -> 17.9 s). Everything a run writes is closed
    before `main` returns; atexit handlers (trackers, logging) still run, and stdout/stderr are flushed."""
    rc = main()
    if "torch" in sys.modules:
        import atexit
        import os

        # atexit's one way to run every handler now, those registered before `entry` included: a public exit
        # function that ended the process would run before them (last in, first out) and skip them.
        run_exit_functions = getattr(atexit, "_run_exitfuncs", None)
        if run_exit_functions is not None:
            run_exit_functions()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    sys.exit(rc)


def _main(args: argparse.Namespace) -> int:
    """Run the parsed command; user errors become one line on stderr and exit status 2, Ctrl-C 130."""
    try:
        return COMMANDS[args.command].run(args)
    except ObliviateError as exc:
        print(f"obliviate: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line, always
        return 2
    except KeyboardInterrupt as exc:
        print(f"obliviate: interrupted; {exc or 'nothing was written'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `obliviate ls | head`: the reader left; say nothing more, like other CLI tools
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
