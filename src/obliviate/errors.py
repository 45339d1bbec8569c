"""User-facing error types: the CLI prints their message and exits non-zero, without a traceback."""


class ObliviateError(Exception):
    """A problem with the user's input (data, config, model path); the message says how to fix it."""


class DataError(ObliviateError):
    """Malformed, missing or inconsistent data."""


class ConfigError(ObliviateError):
    """Unknown key, wrong type or impossible value in a config."""
