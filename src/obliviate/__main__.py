"""`python -m obliviate ...`: the same command line as the `obliviate` script (cli.entry), for environments where the
package is importable but its console script is not installed (e.g. PYTHONPATH=src)."""
from obliviate.cli import entry

if __name__ == "__main__":
    entry()
