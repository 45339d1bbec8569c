"""The one HTML page of every report: title, meta, stylesheet, and the Markdown the comparison report is written in."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from obliviate.report.page import markdown_body, page  # noqa: E402
from obliviate.resources import stylesheet  # noqa: E402


def test_page_holds_title_meta_and_the_shared_stylesheet():
    html = page("a <b> title", "<p>x</p>", meta="run & more")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert "<title>a &lt;b&gt; title</title>" in html and "<h1>a &lt;b&gt; title</h1>" in html
    assert '<p class="meta">run &amp; more</p>' in html
    assert stylesheet() in html
    assert html.index("<h1>") < html.index("<p>x</p>")
    assert 'class="meta"' not in page("t", "")


def test_markdown_tables_headings_and_paragraphs():
    md = "# Title\n\nSome <text>\n\n## Part\n\n| a | b |\n|---|---:|\n| 1 | <2> |\n| 3 | 4 |\ntail"
    body = markdown_body(md)
    assert "Title" not in body  # the page's h1 says it
    assert "<p>Some &lt;text&gt;</p>" in body and "<h2>Part</h2>" in body
    assert ("<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>&lt;2&gt;</td></tr>"
            "<tr><td>3</td><td>4</td></tr></tbody></table>") in body
    assert body.index("</table>") < body.index("<p>tail</p>")
    assert "<h1>Title</h1>" in markdown_body(md, skip_title=False)
    assert markdown_body("| x |\n|---|\n| 5 |").endswith("<td>5</td></tr></tbody></table>")  # a table at the end


def test_only_named_figures_are_embedded():
    fig = plt.figure()
    body = markdown_body("![front](frontier.png)\n![other](missing.png)", {"frontier.png": fig})
    assert body.count("data:image/png;base64,") == 1 and 'alt="front"' in body
    assert "<p>![other](missing.png)</p>" in body
    plt.close(fig)
