"""Issue 58's review-at-scale bench on a quiet host: the lent GPU machine's CPU cores (no GPU
is used), because the 2-core development machines are shared and every page figure there is
several times a quiet machine's.

    python3 -m gpukit.system.review_scale --services DIR_OR_TAR --res RES [--tree LABEL=DIR ...]
        [--results 100000 --repeat 10 --actions 15]

The carried PostgreSQL and Redis (gpukit/system/build.sh's b/, as the system stage starts them)
on loopback; then ``bench/review_scale.py`` of each --tree (default: this one, as ``this_tree``; another is a
``git archive`` of an earlier commit carried beside), one after the other on the same servers,
so they are compared on one machine. Each run's JSON and Markdown land in RES
as ``review_scale_<label>.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpukit.system.run import Services, log, unpack_services  # noqa: E402


def bench(tree: Path, label: str, services: Services, res: Path, a) -> int:
    admin = f"postgresql+psycopg://postgres@127.0.0.1:{services.pg_port}/postgres"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
    argv = [sys.executable, "-m", "bench.review_scale", "--admin-url", admin,
            "--redis-url", f"redis://127.0.0.1:{services.redis_port}/14", "--results", str(a.results),
            "--repeat", str(a.repeat), "--actions", str(a.actions), "--out", str(res / f"review_scale_{label}")]
    log(f"{label}: {' '.join(argv[1:])}")
    t0 = time.monotonic()
    with open(res / f"review_scale_{label}.log", "w") as out:
        rc = subprocess.run(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    log(f"{label}: rc={rc} in {time.monotonic() - t0:.0f} s")
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=Path, required=True, help="build.sh's services.tar.xz or where it was unpacked")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "review-scale")
    ap.add_argument("--res", type=Path, required=True)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                    help="a tree to measure (repeat for several, in order); default this_tree=this repo")
    ap.add_argument("--results", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--actions", type=int, default=15)
    a = ap.parse_args(argv)
    a.res.mkdir(parents=True, exist_ok=True)
    root = unpack_services(a.services, a.work / "services")
    services = Services(root, a.work, pg_port=55432, redis_port=56379)
    services.start(a.res)
    rc = 0
    try:
        for label, tree in (t.split("=", 1) for t in a.tree or [f"this_tree={ROOT}"]):
            rc |= bench(Path(tree).resolve(), label, services, a.res, a)
    finally:
        services.stop()
    (a.res / "host.txt").write_text(f"cpus {os.cpu_count()}\nloadavg {Path('/proc/loadavg').read_text()}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
