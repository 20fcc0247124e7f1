"""comparison.html: the Markdown report as one self-contained page.

The page is comparison.md turned into HTML (the report's own small
Markdown: headings, paragraphs, lists, tables, bold, code, images), with
every figure inline: the figures of `figures.write_figures` as SVG, other
images (the heat maps) as PNG data URIs. Nothing is fetched, so it opens
offline and can be sent as one file.
"""

import base64
import html
import os
import re

_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#1d1d1d}
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
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_INLINE = (
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)"), r'<a href="\2">\1</a>'),
)


def _inline(text, image):
    """Escapes `text` and applies bold, code and images (`image(alt,
    path)` gives an image's markup)."""
    parts = []
    last = 0
    for match in _IMAGE.finditer(text):
        parts.append(_styled(text[last:match.start()]))
        parts.append(image(match.group(1), match.group(2)))
        last = match.end()
    parts.append(_styled(text[last:]))
    return "".join(parts)


def _styled(text):
    text = html.escape(text.replace("\\|", "|"), quote=False)
    for pattern, replacement in _INLINE:
        text = pattern.sub(replacement, text)
    return text


def _cells(line):
    """The cells of a Markdown table row (`\\|` is a literal bar)."""
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip() for cell in cells]


def _table(rows, image):
    header, body = _cells(rows[0]), [_cells(row) for row in rows[2:]]
    head = "".join(f"<th>{_inline(cell, image)}</th>" for cell in header)
    lines = "".join(
        "<tr>" + "".join(f"<td>{_inline(cell, image)}</td>" for cell in row)
        + "</tr>" for row in body
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>"


def markdown_to_html(text, image):
    """The report's Markdown as HTML body markup."""
    out, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip(), image)}"
                       f"</h{level}>")
            index += 1
        elif line.startswith("|"):
            end = index
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            out.append(_table(lines[index:end], image))
            index = end
        elif line.startswith("- "):
            items = []
            while index < len(lines) and lines[index].startswith("- "):
                items.append(f"<li>{_inline(lines[index][2:], image)}</li>")
                index += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        else:
            paragraph = []
            while (index < len(lines) and lines[index].strip()
                   and not lines[index].startswith(("#", "|", "- "))):
                paragraph.append(lines[index])
                index += 1
            joined = " ".join(paragraph)
            # A figure on its own is a block, not inside a paragraph.
            out.append(_inline(joined, image) if _IMAGE.fullmatch(joined)
                       else f"<p>{_inline(joined, image)}</p>")
    return "\n".join(out)


def render_page(logdir, report_markdown, figures, title):
    """comparison.html's text.

    Args:
        logdir: the comparison's directory (images are read from it).
        report_markdown: comparison.md's text.
        figures: the entries of `figures.write_figures` (their PNG paths in
            the Markdown are replaced by their SVG).
        title: the page title.
    """
    svg_by_path = {item["path"]: item for item in figures}

    def image(alt, path):
        if path in svg_by_path:
            item = svg_by_path[path]
            return (f'<figure id="figure-{item["name"]}">{item["svg"]}'
                    f"<figcaption>{html.escape(item['caption'])}"
                    "</figcaption></figure>")
        full = os.path.join(logdir, path)
        if not os.path.isfile(full):
            return html.escape(f"[{alt}: {path} missing]")
        with open(full, "rb") as handle:
            data = base64.b64encode(handle.read()).decode("ascii")
        return (f'<img alt="{html.escape(alt)}" '
                f'src="data:image/png;base64,{data}">')

    body = markdown_to_html(report_markdown, image)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f"</head><body>\n{body}\n</body></html>\n"
    )
