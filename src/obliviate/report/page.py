"""The one HTML page every report is (run, demo, audit, sweep comparison): a self-contained document with the shared
stylesheet inlined, and the Markdown → HTML conversion the comparison report uses for its tables and figures."""
from __future__ import annotations

from html import escape
from typing import Any, Mapping

from obliviate.resources import stylesheet


def page(title: str, body: str, meta: str | None = None) -> str:
    """A whole HTML document: `title` as <title> and <h1>, `meta` (plain text) under it, `body` (HTML) after."""
    head = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{stylesheet()}</style></head><body><h1>{escape(title)}</h1>")
    if meta:
        head += f"<p class=\"meta\">{escape(meta)}</p>"
    return f"{head}{body}</body></html>\n"


def _table(lines: list[str]) -> str:
    """A Markdown pipe table (header, separator, rows) as an HTML table."""
    rows = [r.strip().strip("|").split("|") for r in lines if not set(r.replace("|", "").strip()) <= {"-", ":"}]
    head, *rest = rows
    return ("<table><thead><tr>" + "".join(f"<th>{escape(c.strip())}</th>" for c in head) + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{escape(c.strip())}</td>" for c in r) + "</tr>" for r in rest)
            + "</tbody></table>")


def markdown_body(markdown: str, images: Mapping[str, Any] | None = None, skip_title: bool = True) -> str:
    """The HTML of a report written in Markdown: headings, pipe tables, paragraphs, and `![alt](name)` lines whose
    name is in `images` (matplotlib figures) embedded as base64 PNGs. The first level-1 heading is dropped when
    `skip_title` (page() prints the title)."""
    from obliviate.report.plots import png_base64

    images = dict(images or {})
    body: list[str] = []
    table: list[str] = []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            body.append(_table(table))
            table = []
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            if level == 1 and skip_title:
                skip_title = False
                continue
            body.append(f"<h{level}>{escape(line.lstrip('# '))}</h{level}>")
        elif line.startswith("![") and "](" in line and line.endswith(")") \
                and line[line.index("](") + 2:-1] in images:
            name = line[line.index("](") + 2:-1]
            body.append(f'<img alt="{escape(line[2:line.index("](")])}" src="data:image/png;base64,'
                        f'{png_base64(images[name], close=False)}">')
        elif line.strip():
            body.append(f"<p>{escape(line)}</p>")
    return "\n".join(body)
