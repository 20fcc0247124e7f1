"""A report's self-contained HTML page from its Markdown (markdown-it-py,
CommonMark with tables): figures inlined as SVG, other images as PNG data
URIs, raw HTML escaped, nothing fetched, so it opens offline."""

import base64
import html
import os

from markdown_it import MarkdownIt

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:24px auto;
padding:0 16px;color:#1d1d1d}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}
thead{background:#f3f3f3}
code{background:#f3f3f3;padding:0 3px}
figure{margin:12px 0 24px}
figure svg,img{max-width:100%;height:auto}
li img{display:block}
figcaption{font-size:13px;color:#444}
"""


def _image_markup(logdir, figures, alt, path):
    if path in figures:
        item = figures[path]
        return (f'<figure id="figure-{html.escape(item["name"])}">'
                f'{item["svg"]}<figcaption>{html.escape(item["caption"])}'
                "</figcaption></figure>")
    full = os.path.join(logdir, path)
    if not os.path.isfile(full):
        return html.escape(f"[{alt}: {path} missing]")
    with open(full, "rb") as handle:
        data = base64.b64encode(handle.read()).decode("ascii")
    return (f'<img alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{data}">')


def render_page(logdir, report_markdown, figures, title):
    """The page's text; images are read from `logdir`, and `figures`
    (`plotting.write_figures`) replace their PNG paths by their SVG."""
    by_path = {item["path"]: item for item in figures}
    parser = MarkdownIt("commonmark", {"html": False}).enable("table")

    def render_image(renderer, tokens, index, options, env):
        token = tokens[index]
        alt = "".join(child.content for child in token.children or ())
        return _image_markup(logdir, by_path, alt, token.attrGet("src"))

    parser.add_render_rule("image", render_image)
    body = parser.render(report_markdown)
    # A figure alone in its paragraph is a block of its own (a <figure>
    # may not sit inside a <p>).
    body = body.replace("<p><figure", "<figure").replace("</figure></p>",
                                                          "</figure>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"</head><body>\n{body}\n</body></html>\n"
    )
