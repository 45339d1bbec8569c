"""`python -m obliviate.cli ...`: the `obliviate` command."""
from obliviate.cli import entry

entry()
