"""Trace text made safe for where it is shown: a terminal, a Markdown comment, an HTML page.

A trace is input like any other: its names (kernels, ops, modules, devices, annotations)
may hold control characters (`ESC]0;…` retitles a terminal, `ESC[2J` clears it), rich
markup (`[/x]` raises, `[link=…]` makes a hidden hyperlink), Markdown (`[click](…)`,
`![x](…)`), HTML (`<img onerror=…>`, `<!--<script>`) or megabytes of one name. Every
renderer passes trace text through one function here on its way out, so each output
shows the name literally, on one line, at most `NAME_CHARS` characters of it. Frames,
JSON and SARIF keep the exact text: they are data, not display.
"""

from __future__ import annotations

import html
import re

from rich.text import Text

NAME_CHARS = 200
"""The most of one name a terminal, Markdown or HTML cell shows; the rest is counted
(`… (4,000,000 chars)`), and the JSON output has it whole."""
LINE_CHARS = 1000
"""The most of one line of prose that quotes names (a finding's message) a terminal or
Markdown shows."""
TITLE_CHARS = 4000
"""The most of one name an HTML tooltip (`title`) holds: long C++ kernel names whole."""

_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0 (ESC, BEL, CR, LF, TAB ...), DEL, C1 (CSI, OSC ...)
    "\u2028\u2029"  # line and paragraph separators
    "\u202a-\u202e\u2066-\u2069]"  # bidirectional overrides: text that reads other than it is
)
_MARKDOWN = re.compile(r"([\\`*\[\]|#~])")  # with `[` `]` escaped, no `](…)` is a link
_UNDERSCORES = re.compile("_+")
_SCRIPT_JSON = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                "\u2029": "\\u2029"}  # fmt: skip


def clip(text: object, limit: int = NAME_CHARS) -> str:
    """At most `limit` characters of `text`, and how long it was when cut:
    a 4 MB name costs a table no more than a short one."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} chars)"


def printable(text: object) -> str:
    """`text` with every control character shown as its escape (`\\x1b`, `\\x0a`, `\\u2028`):
    nothing reaches a terminal that it would act on, and a name stays on one line."""
    return _CONTROL.sub(_escaped, "" if text is None else str(text))


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text: object, limit: int | None = NAME_CHARS, style: str = "") -> Text:
    """Trace text for rich: a `Text`, which rich never parses as markup, clipped and
    printable. Use it for table cells and anywhere a name meets `console.print`."""
    shown = text if limit is None else clip(text, limit)
    return Text(printable(shown), style=style)


def markdown(text: object, limit: int | None = NAME_CHARS) -> str:
    """Trace text for a Markdown cell or line (a pull-request comment): clipped, printable,
    HTML as entities and the characters Markdown acts on backslash-escaped (brackets, so
    `[x](…)` and `![x](…)` are no link or image; emphasis, code, `|`), so no link, image,
    HTML, emphasis, code span or table cell break comes of it."""
    shown = printable(text if limit is None else clip(text, limit))
    escaped = _MARKDOWN.sub(r"\\\1", html.escape(shown, quote=False))
    return _UNDERSCORES.sub(_underscores, escaped)


def _underscores(match: re.Match[str]) -> str:
    """`_` between two letters or digits (`graph_0_cpp`) never starts or ends emphasis in
    CommonMark and stays as it is, so names read the same in the raw comment; any other
    `_` is escaped."""
    text, start, end = match.string, match.start(), match.end()
    inside = start > 0 and end < len(text) and text[start - 1].isalnum() and text[end].isalnum()
    return match.group() if inside else match.group().replace("_", "\\_")


def markdown_code(text: object, limit: int | None = NAME_CHARS) -> str:
    """Trace text as a Markdown code span: shown as it is in monospace (nothing inside a
    code span is a link or HTML), fenced by more backticks than it holds, `|` escaped for
    a table."""
    shown = printable(text if limit is None else clip(text, limit)).replace("|", "\\|")
    fence = "`" * (max(map(len, re.findall("`+", shown)), default=0) + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def html_text(text: object, limit: int | None = None) -> str:
    """Trace text for HTML content or an attribute: printable, then escaped."""
    return html.escape(printable(text if limit is None else clip(text, limit)), quote=True)


def plotly_text(text: object) -> str:
    """Trace text for a plotly label, tick, legend entry or hover text: plotly renders a
    subset of HTML there (`<a href>`, `<b>`, `<br>`) and decodes `&lt;` `&gt;` `&amp;`, so
    escaping those three shows the name as it is. (Not `"`: plotly does not decode `&quot;`.)"""
    return html.escape(printable(text), quote=False)


def plotly_template(text: object) -> str:
    """Trace text written into a plotly `hovertemplate`: `plotly_text`, and `%` as `&#37;`
    (plotly decodes it when drawing) so a name cannot hold a `%{…}` placeholder."""
    return plotly_text(text).replace("%", "&#37;")


def script_json(text: str) -> str:
    """JSON text safe inside `<script>`: `<`, `>`, `&` and U+2028/2029 as `\\u` escapes.
    JSON has them only inside strings, where the escapes read back the same; no
    `</script>` or `<!--` can end or bend the script element."""
    return re.sub("[<>&\u2028\u2029]", lambda m: _SCRIPT_JSON[m.group()], text)
