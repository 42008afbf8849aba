"""If-Match as RFC 9110 reads it, against the result's review version (its ETag, ``"v3"``).

werkzeug parses the header (``parse_etags``: lists, ``*``, weak tags). Weak tags count: a
proxy that compresses JSON (nginx ``gzip_types application/json``) turns ``"v3"`` into
``W/"v3"`` on the way out, and the client sends back what it got. A list matches when any of
its tags does. What none of this can name is a client error (400), never a server one.
"""

from __future__ import annotations

from werkzeug.http import parse_etags

from vidlora.digits import whole_number


class IfMatchError(ValueError):
    """The header is there but names no review version (400)."""


class FutureVersion(ValueError):
    """The header names only versions the result never had (412: the precondition is false,
    and no review since the client's read explains it)."""


def _version(tag: str | None) -> int | None:
    if not tag:  # If-Match: "" parses to an empty (or no) tag
        return None
    return whole_number(tag[1:]) if tag[:1] == "v" else None


def if_match_version(header: str | None, current: int) -> int | None:
    """The review version the client read: None without the header (a note needs none);
    ``current`` for ``*`` or a list that holds it; else the newest version it names, which a
    caller refuses as stale (409, with what changed since)."""
    if header is None or not header.strip():
        return None
    tags = parse_etags(header)
    if tags.star_tag:
        return current
    named = [v for v in (_version(t) for t in tags.as_set(include_weak=True)) if v is not None]
    if not named:
        raise IfMatchError('If-Match must be the result\'s ETag as you read it (for example "v3", '
                           'or W/"v3" as a compressing proxy passes it on).')
    if current in named:
        return current
    if min(named) > current:
        raise FutureVersion(f"If-Match names version {min(named)}, but this result is at version {current}: "
                            f"it never had that version. Read it again (its ETag is \"v{current}\").")
    return max(v for v in named if v < current)
