"""The repository stands alone: nothing in it reads or names a path outside it (or the default package index's
host), and every docs/ file and section the code and the README cite exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = ["src", "configs", "tests", "benchmarks", "scripts", "docs", "README.md", "CHANGELOG.md", ".ci/run",
          "install.sh", "pyproject.toml"]
# built from pieces so that this file does not match itself
FORBIDDEN = {".." + "/shared": "a sibling folder users do not have",
             "shared" + "/": "a path into a sibling folder users do not have",
             "pypi" + ".org": "the default package index's host (pip's own configuration decides it)"}


def _files() -> list[Path]:
    out = []
    for place in PLACES:
        p = ROOT / place
        cands = [p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else []
        out += [f for f in cands if f.is_file() and "__pycache__" not in f.parts and ".egg-info" not in str(f)
                and f.suffix not in (".pyc", ".png", ".safetensors", ".gguf")]
    return out


def test_nothing_names_a_path_outside_the_repository_or_the_default_index():
    hits = []
    for f in _files():
        text = f.read_text(encoding="utf-8", errors="replace")
        hits += [f"{f.relative_to(ROOT)}: {pat!r} ({why})" for pat, why in FORBIDDEN.items() if pat in text]
    assert not hits, "\n".join(hits)


def _sections(doc: Path) -> set[str]:
    """The § numbers of a doc's headings ("## §2 Gradient rules" or "## 2. Gradient rules" -> "2")."""
    return set(re.findall(r"^#+\s*(?:§\s*)?(\d+(?:\.\d+)*)[.\s]", doc.read_text(encoding="utf-8"), flags=re.M))


def test_every_cited_doc_and_section_exists():
    cited = 0
    for f in _files():
        if f.suffix not in (".py", ".md", ".yaml", ".toml") or f.parent.name == "docs":
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        for name, sec in re.findall(r"\b(METHODS|METRICS|DESIGN)\.md(?:\W{1,3}§\s*(\d+(?:\.\d+)*))?", text):
            cited += 1
            doc = ROOT / "docs" / f"{name}.md"
            assert doc.is_file(), f"{f.relative_to(ROOT)} cites {name}.md, which is not in docs/"
            assert not sec or sec in _sections(doc), f"{f.relative_to(ROOT)} cites {name}.md §{sec}: no such section"
    assert cited > 10


def test_the_readme_links_the_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("docs/METHODS.md", "docs/METRICS.md", "docs/DESIGN.md", "docs/GUIDE.md", "docs/results.md",
                 "CHANGELOG.md"):
        assert f"({name})" in readme, f"the README does not link {name}"
        assert (ROOT / name).is_file(), name


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_readme_and_docs_resolves():
    """Links to files (and to a heading in them) from README.md, CHANGELOG.md and docs/*.md point at something."""
    checked = 0
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.relative_to(ROOT)} links {target}: no such file"
            if anchor and dest.suffix == ".md":
                heads = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), flags=re.M)
                assert anchor in {_anchor(h) for h in heads}, f"{page.relative_to(ROOT)} links {target}: no such heading"
            checked += 1
    assert checked > 20


def test_the_license_file_is_the_license_pyproject_declares():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


# Numbers in the README's prose that are not measurements: a reference, a requirement, a level chosen by the user.
NOT_MEASURED = {"3.10": "Python >= 3.10", "95%": "the interval level (compare --level)"}


def test_every_number_the_readme_states_is_in_the_dated_results():
    """A measured number in the README (a decimal or a percentage outside commands, code and keys) must appear in
    docs/results.md (dated, with its spread and command) or in a report `obliviate compare` regenerates
    (docs/sweeps/): a number changed in one place and not the other fails here."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    prose = re.sub(r"```(bash|yaml|python)\n.*?```", "", readme, flags=re.S)  # commands and code
    prose = re.sub(r"`[^`]*`", "", prose)  # keys and values in inline code
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    prose = re.sub(r"arXiv \d{4}\.\d{4,5}", "", prose)  # references
    numbers = set(re.findall(r"(?<![\w.§])(\d+\.\d+(?:e-?\d+)?|\d+(?:\.\d+)?%)", prose)) - set(NOT_MEASURED)
    assert len(numbers) > 30  # the demo's table and the sweep's verdict are read
    sources = (ROOT / "docs" / "results.md").read_text(encoding="utf-8") + "".join(
        p.read_text(encoding="utf-8", errors="ignore") for p in sorted((ROOT / "docs" / "sweeps").rglob("*"))
        if p.suffix in (".md", ".json"))
    missing = sorted(n for n in numbers if n not in sources)
    assert missing == [], f"README numbers found neither in docs/results.md nor in docs/sweeps/: {missing}"
