"""`obliviate ls` reads the built-ins from source (no torch); it must equal the live registries."""
import subprocess
import sys


def test_static_catalogue_equals_the_registries():
    from obliviate.catalogue import builtin
    from obliviate.gradients import RULES
    from obliviate.objectives import FORGET, RETAIN

    def first_line(fn):
        doc = (fn.__doc__ or "").strip().splitlines()
        return doc[0] if doc else ""

    assert builtin("forget") == {n: FORGET.get(n).summary for n in FORGET.names()}
    assert builtin("retain") == {n: RETAIN.get(n).summary for n in RETAIN.names()}
    assert builtin("rule") == {n: first_line(RULES.get(n).fn) for n in RULES.names()}
    assert "idk_dpo" in builtin("forget") and "gru_ema" in builtin("rule")  # alias and plain registrations


def test_ls_imports_no_torch():
    code = ("import sys, io, contextlib; from obliviate.cli import main; buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf): rc = main(['ls'])\n"
            "assert rc == 0 and 'asu' in buf.getvalue() and 'sago' in buf.getvalue(), buf.getvalue()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_mutant_applies_to_the_current_code():
    """scripts/mutants.py: each snippet occurs exactly once in its file (else the check would stop midway)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "mutants.py"
    spec = importlib.util.spec_from_file_location("mutants", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutants"] = mod  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("mutants", None)
    bad = [(m.name, (mod.ROOT / mod.SRC / m.file).read_text().count(m.old)) for m in mod.MUTANTS
           if (mod.ROOT / mod.SRC / m.file).read_text().count(m.old) != 1]
    assert not bad and len(mod.MUTANTS) >= 25, bad


def test_the_needs_read_from_source_equal_the_registries():
    """builtin_needs (the config's torch-free way to know which objective has a teacher) = each spec's `needs`."""
    from obliviate.catalogue import builtin, builtin_needs
    from obliviate.objectives import FORGET, RETAIN

    for kind, reg in (("forget", FORGET), ("retain", RETAIN)):
        read = builtin_needs(kind)
        assert read == {n: tuple(reg.get(n).needs) for n in read} and set(read) == set(builtin(kind))
    assert builtin_needs("forget")["asu"] == ("teacher",)
    assert [n for n, needs in builtin_needs("forget").items() if "teacher" in needs] == ["asu"]
