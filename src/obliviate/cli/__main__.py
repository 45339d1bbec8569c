"""`python -m obliviate.cli ...`: the `obliviate` command."""
import sys

from obliviate.cli import main

sys.exit(main())
