"""mkdocs hook: a placeholder such as <name> or <output_dir> in prose stays text.

Markdown passes ``<name>`` through as an HTML tag, which the browser then hides (``hf:<name>``
would read ``hf:``). Outside fenced blocks and inline code, ``<word>`` is written as
``&lt;word&gt;``; the pages use no raw HTML.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
_CODE = re.compile(r"(`+)(?:.|\n)*?\1")
_PLACEHOLDER = re.compile(r"<([a-z_][\w \-]*)>")


def escape_placeholders(markdown: str) -> str:
    """``markdown`` with each prose ``<word>`` escaped; code (fenced or inline) left as it is."""

    def prose(text: str) -> str:
        out, last = [], 0
        for m in _CODE.finditer(text):
            out += [_PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:m.start()]), m.group(0)]
            last = m.end()
        return "".join(out + [_PLACEHOLDER.sub(r"&lt;\1&gt;", text[last:])])

    out, last = [], 0
    for m in _FENCE.finditer(markdown):
        out += [prose(markdown[last:m.start()]), m.group(0)]
        last = m.end()
    return "".join(out + [prose(markdown[last:])])


def on_page_markdown(markdown, page, config, files):
    return escape_placeholders(markdown)
