"""Page numbers from the query string, and what a template needs to draw page links."""

from __future__ import annotations

from dataclasses import dataclass

from flask import request


MAX_PAGE = 1_000_000  # far past any real listing; keeps OFFSET inside PostgreSQL's bigint


def page_number(arg: str = "page") -> int:
    try:
        return min(MAX_PAGE, max(1, int(request.args.get(arg, 1))))
    except ValueError:
        return 1


@dataclass
class Page:
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def has_prev(self) -> bool:
        return self.number > 1

    @property
    def has_next(self) -> bool:
        return self.number < self.pages

    @property
    def first_index(self) -> int:
        return 0 if self.total == 0 else (self.number - 1) * self.size + 1

    @property
    def last_index(self) -> int:
        return min(self.total, self.number * self.size)

    def args(self, number: int) -> dict:
        """The current query string with another page number (filters kept)."""
        args = request.args.to_dict(flat=False)
        args["page"] = [str(number)]
        return args
