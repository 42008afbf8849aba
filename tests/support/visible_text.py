"""The text of a page (or part of one) a reader sees without opening anything: the contents of
a closed ``<details>`` are left out (its ``<summary>`` is shown), as are scripts, styles and
attributes (a ``title`` shows only on hover)."""

from __future__ import annotations

from html.parser import HTMLParser

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _Shown(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # open elements: (tag, hides its content)

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        hidden = tag in ("script", "style") or (tag == "details" and "open" not in dict(attrs))
        self.stack.append((tag, hidden))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        # Inside a closed details only its summary shows.
        hidden_at = [i for i, (_t, h) in enumerate(self.stack) if h]
        if not hidden_at:
            self.text.append(data)
            return
        last = hidden_at[-1]
        if (self.stack[last][0] == "details" and len(self.stack) > last + 1 and self.stack[last + 1][0] == "summary"
                and len(hidden_at) == 1):
            self.text.append(data)


def shown_text(html: str) -> str:
    parser = _Shown()
    parser.feed(html)
    parser.close()
    return " ".join(" ".join(parser.text).split())
