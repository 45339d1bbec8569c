"""The package's layout, drawn from its imports (scripts/layout.py): no cycle, nothing imported back up, at most
MAX_FLOORS floors, no private name taken from another module; and the drawing itself on a hand-made graph."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("layout", ROOT / "scripts" / "layout.py")
layout = importlib.util.module_from_spec(spec)
sys.modules["layout"] = layout
spec.loader.exec_module(layout)


def test_floors_and_cycles_of_a_hand_made_graph():
    g = {"a": set(), "b": {"a"}, "c": {"b", "a"}, "d": {"e"}, "e": {"d", "c"}}
    assert layout.cycles(g) == [["d", "e"]]
    assert layout.floors(g) == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 4}  # a cycle shares one floor


def test_the_package_has_no_cycle_no_import_back_up_and_few_floors():
    s = layout.summary(layout.read_layout())
    assert s["module_cycles"] == [] and s["room_cycles"] == [], s
    assert s["up_imports"] == [], s["up_imports"]
    assert s["floors"] <= layout.MAX_FLOORS, s["by_floor"]
    assert s["private_imports"] == [], s["private_imports"]


def test_the_command_line_is_the_top_floor_and_errors_the_bottom():
    s = layout.summary(layout.read_layout())
    assert s["by_floor"][s["floors"]] == ["cli"]
    assert "errors" in s["by_floor"][1]


def test_only_the_command_line_imports_the_demos():
    """Library code (sweeps, evaluation, …) never depends on a demo: what both run on lives in `setups`."""
    lay = layout.read_layout()
    importers = {lay.room_of(e.src) for e in lay.edges if lay.room_of(e.dst) == "demos"} - {"demos"}
    assert importers == {"cli"}, importers


def test_lazy_loading_has_one_rule_and_the_package_keeps_it():
    """An import waits inside a function only from a light module to a heavy one (scripts/layout.py); the command
    line's modules are light; and the light set is real: importing every light module at once loads no heavy
    package."""
    import subprocess

    lay = layout.read_layout()
    assert layout.needless_deferrals(lay) == []
    heavy = layout.heavy_modules(lay)
    light = sorted(set(lay.modules) - heavy)
    assert {m for m in lay.modules if m.split(".")[0] == "cli"} <= set(light)
    assert {"train.loop", "modeling.logprobs", "eval.tofu"} <= heavy
    names = ["obliviate" if m == "__init__" else f"obliviate.{m}" for m in light if not m.endswith("__main__")]
    code = (f"import importlib, sys\nfor n in {names!r}:\n    importlib.import_module(n)\n"
            f"print(sorted(m for m in {sorted(layout.HEAVY)!r} if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_a_needless_deferral_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "src" / "obliviate"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "heavy.py").write_text("import torch\n")
    (pkg / "light.py").write_text("X = 1\n")
    (pkg / "user.py").write_text("def f():\n    from obliviate import heavy\n\n\ndef g():\n"
                                 "    from obliviate.light import X\n")
    (pkg / "big.py").write_text("import numpy\n\n\ndef h():\n    from obliviate import heavy\n")
    monkeypatch.setattr(layout, "SRC", tmp_path / "src")
    lay = layout.read_layout()
    assert layout.heavy_modules(lay) == {"heavy", "big"}
    assert layout.needless_deferrals(lay) == ["big:5 -> heavy", "user:6 -> light"]


def test_deferred_and_private_imports_are_seen(tmp_path, monkeypatch):
    pkg = tmp_path / "src" / "obliviate"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("_hidden = 1\n")
    (pkg / "sub" / "high.py").write_text("def f():\n    from obliviate.low import _hidden\n    return _hidden\n")
    (pkg / "back.py").write_text("from obliviate.sub import high\n")
    (pkg / "low2.py").write_text("from . import back\n")
    monkeypatch.setattr(layout, "SRC", tmp_path / "src")
    lay = layout.read_layout()
    s = layout.summary(lay)
    assert s["deferred_imports"] == 1
    assert s["private_imports"] == ["sub.high <- low._hidden"]
    assert s["module_cycles"] == [] and s["floors"] == 4  # low(1) <- sub(2) <- back(3) <- low2(4)


def test_no_module_is_over_500_lines():
    """Big modules hide logic behind a package face: each module stays at most 500 lines (split by what it holds)."""
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "src" / "obliviate").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}, long
