"""User-facing error types: the CLI prints their message and exits non-zero, without a traceback."""


class ObliviateError(Exception):
    """A problem with the user's input (data, config, model path); the message says how to fix it."""


class DataError(ObliviateError):
    """Malformed, missing or inconsistent data."""


class ConfigError(ObliviateError):
    """Unknown key, wrong type or impossible value in a config."""


class DivergenceError(ObliviateError):
    """Training produced a non-finite or exploding loss, gradient or weight: nothing may be saved or evaluated."""


class CheckpointMismatchError(ConfigError):
    """A checkpoint in train.checkpoint_dir was written by a run with other settings, model or data."""


class LaunchError(ObliviateError):
    """An inconsistent multi-process launch (e.g. torchrun processes that would not form one data-parallel group)."""
