"""Page numbers from the query string, and what a template needs to draw page links."""

from __future__ import annotations

from dataclasses import dataclass

from flask import request

from vidlora.digits import whole_number


MAX_PAGE = 1_000_000  # far past any real listing; keeps OFFSET inside PostgreSQL's bigint
PAGE_SIZES = (20, 50, 100, 200)


def page_number(arg: str = "page") -> int:
    return min(MAX_PAGE, max(1, whole_number(request.args.get(arg), most_digits=30) or 1))


def last_page_at_most(number: int, size: int, total: int) -> int:
    """A page past the end shows the last page ("9951-10040 of 10040"), not an empty one
    numbered past the total."""
    return max(1, min(number, -(-total // size)))


def page_size(default: int, arg: str = "per_page") -> int:
    """The reader's page size when it is one offered, else the default."""
    size = whole_number(request.args.get(arg)) or default
    return size if size in PAGE_SIZES or size == default else default


@dataclass
class Page:
    number: int
    size: int
    total: int
    exact: bool = True  # False: ``total`` is the database's estimate (vidlora.results.query.bounded_count)

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

    def kept_args(self) -> list[tuple[str, str]]:
        """The current query string without the page number: hidden fields of a jump form."""
        return [(k, v) for k, values in request.args.lists() if k != "page" for v in values]
