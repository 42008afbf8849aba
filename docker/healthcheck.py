"""Container health probe: GET a URL, exit 0 on a 2xx/3xx answer, 1 otherwise.

Used by the web and flower services (their images have no curl). Standard library only,
so it runs before or without the app's own imports.

    python docker/healthcheck.py http://127.0.0.1:8000/healthz [timeout_s]
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def check(url: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback URL from compose)
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    if 200 <= status < 400:
        return 0
    print(f"unhealthy: {url}: HTTP {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(check(sys.argv[1], float(sys.argv[2]) if len(sys.argv) == 3 else 5.0))
