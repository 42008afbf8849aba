"""A team on one queue at 100k results (issue 58): how fast every page and API call answers,
how long the 100k CSV export takes, and how many Approve presses meet a conflict when 3 and
10 reviewers share the least-certain-first queue.

The real app (``web.create_app``) is served by a threaded werkzeug server on a database of
its own made on the PostgreSQL server at ``--admin-url`` (dropped after), seeded with
``--results`` structured results (a tenth of them reviewed) through SQL. Each page and call
is requested ``--repeat`` times over HTTP, signed in as a reviewer (pages) or with a token
(API); p95 is over those. The reviewers are HTTP clients doing what the review page does in
a browser (tests/system/browser/test_review_leases.py walks it in Chromium): open the
queue's first answer, then press Approve (the page's version and CSRF token) and follow
where the queue sends them, ``--actions`` presses each, all at once in threads.

A p95 is the nearest rank (with ``--repeat 10`` the slowest of the ten, with the default 20 the
second slowest); each call's slowest request is reported beside it: for a page that keeps what
it computed, its first view after the server started. The Scenarios page keeps its measures until a result is
stored or reviewed; it is also timed right after each of ``--repeat`` reviews, when it scores
the scenario's reviewed answers again.

    python -m bench.review_scale --results 100000 --out bench/results/review_scale
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

DEFAULT_ADMIN = os.environ.get("VIDLORA_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
PASSWORD = "bench password for review scale"
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["finds", "sealed"],
    "properties": {
        "site": {"type": "string", "maxLength": 20},
        "sealed": {"type": "boolean"},
        "finds": {"type": "array", "maxItems": 5, "items": {
            "type": "object", "additionalProperties": False, "required": ["material", "period", "confidence"],
            "properties": {"material": {"enum": ["bronze", "jade", "ceramic"]},
                           "period": {"enum": ["han", "tang", "unknown"]},
                           "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}},
    },
}
CSRF = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
VERSION = re.compile(r'<input type="hidden" name="version" value="(\d+)"')


def seed(engine, n: int, scenario: str) -> None:
    """``n`` done analyses with structured results in ten batches; every tenth reviewed."""
    from sqlalchemy import text

    steps = [
        f"""INSERT INTO scenario (name, title, description, prompt, output_schema, adapter_status, sampling, generation, active,
                                  created_at, updated_at)
            VALUES ('{scenario}', 'Catalogue of finds', '', 'List the finds.', '{json.dumps(SCHEMA)}', 'none',
                    '{{"mode": "uniform", "num_frames": 2}}', '{{}}', true, now(), now())""",
        """INSERT INTO batch (name, source, scenario_names, status, created_at)
           SELECT 'Trench ' || b, 'cli', '["{s}"]', 'ingested', now() FROM generate_series(1, 10) b""",
        """INSERT INTO video (sha256, path, original_name, size_bytes, status, attempts, created_at, updated_at,
                              duration_s)
           SELECT md5(i::text) || md5('v' || i::text), 'videos/' || i || '.mp4',
                  CASE WHEN i % 3 = 0 THEN 'Grabkammer_Süd_Ölgefäß_' ELSE 'trench_clip_' END || i || '.mp4',
                  1000, 'ready', 1, now(), now(), 12.5 FROM generate_series(1, :n) i""",
        """INSERT INTO frame_set (video_id, policy_key, policy, status, timestamps, files, created_at, width, height,
                                  backend)
           SELECT id, 'uniform-2', '{}', 'done', '[0.5, 1.5]', '[]', now(), 64, 64, 'bench' FROM video""",
        """INSERT INTO batch_item (batch_id, name, status, video_id, created_at)
           SELECT (SELECT min(id) FROM batch) + v.id % 10, v.original_name, 'stored', v.id, now() FROM video v""",
        """INSERT INTO analysis (video_id, scenario_id, batch_id, frame_set_id, status, attempts, created_at,
                                 finished_at, adapter_version)
           SELECT v.id, (SELECT id FROM scenario WHERE name = '{s}'), (SELECT min(id) FROM batch) + v.id % 10,
                  f.id, 'done', 1, now() - (v.id || ' seconds')::interval, now(), 'digest-abc'
           FROM video v JOIN frame_set f ON f.video_id = v.id""",
        """INSERT INTO result (analysis_id, text, parsed, prompt_tokens, output_tokens, latency_s, finish_reason,
                               health, model, review_state, review_version, confidence, created_at)
           SELECT a.id,
                  '{"sealed": true, "site": "B", "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}',
                  '{"sealed": true, "site": "B", "finds": [{"material": "bronze", "period": "han", "confidence": 0.8}]}',
                  300, 40, 0.5, 'stop', '{"ok": true, "schema_ok": true}', 'tiny',
                  CASE WHEN a.id % 10 = 0 THEN 'approved' ELSE 'unreviewed' END,
                  CASE WHEN a.id % 10 = 0 THEN 1 ELSE 0 END, (a.id * 7919 % 1000) / 1000.0, now()
           FROM analysis a""",
        """INSERT INTO result_field (result_id, path, item, text, num)
           SELECT id, 'sealed', NULL::integer, 'true', NULL::float FROM result UNION ALL
           SELECT id, 'site', NULL, 'B', NULL FROM result UNION ALL
           SELECT id, 'finds.material', 0, CASE WHEN id % 3 = 0 THEN 'jade' ELSE 'bronze' END, NULL FROM result UNION ALL
           SELECT id, 'finds.period', 0, 'han', NULL FROM result UNION ALL
           SELECT id, 'finds.confidence', 0, NULL, 0.8 FROM result""",
        """INSERT INTO result_confidence (result_id, field, confidence, tokens)
           SELECT id, 'finds', confidence, 3 FROM result""",
        """INSERT INTO review (result_id, user_id, action, version, created_at)
           SELECT id, (SELECT min(id) FROM app_user), 'approve', 1, now() FROM result WHERE review_state = 'approved'""",
    ]
    with engine.begin() as conn:
        for step in steps:
            conn.execute(text(step.replace("{s}", scenario)), {"n": n} if ":n" in step else {})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def signed_in(base: str, name: str):
    import requests

    client = requests.Session()
    page = client.get(f"{base}/auth/login")
    token = CSRF.search(page.text).group(1)
    done = client.post(f"{base}/auth/login", data={"username": name, "password": PASSWORD, "csrf_token": token},
                       allow_redirects=False)
    assert done.status_code == 302, done.text[:300]
    client.csrf = CSRF.search(client.get(f"{base}/batches/").text).group(1)
    return client


def timed(client, method: str, url: str, repeat: int, **kwargs) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = client.request(method, url, **kwargs)
        out.append((time.perf_counter() - t0) * 1000)
        assert response.status_code < 400, (url, response.status_code, response.text[:300])
    return out


def reviewers(base: str, names: list[str], scenario: str, actions: int) -> dict:
    """Every reviewer opens the queue's first answer at once, then presses Approve ``actions``
    times, following the queue. Conflicts: presses answered with the conflict page (409)."""
    queue = f"queue=1&scenario={scenario}&status=done&review_state=unreviewed&sort=uncertain"
    clients = [signed_in(base, name) for name in names]
    first = re.search(r'data-testid="review-link-(\d+)"',
                      clients[0].get(f"{base}/results/?{queue.replace('queue=1&', '')}").text).group(1)
    counts = {"presses": 0, "conflicts": 0, "approved_twice": 0}
    lock, start = threading.Lock(), threading.Barrier(len(clients))
    seen: dict[str, int] = {}

    def walk(client) -> None:
        start.wait()
        page = client.get(f"{base}/review/results/{first}?{queue}")
        for _ in range(actions):
            match = re.search(r"/review/results/(\d+)", page.url)
            version = VERSION.search(page.text)
            if not match or not version:
                return  # the queue is empty
            rid = match.group(1)
            page = client.post(f"{base}/review/results/{rid}?{queue}",
                               data={"csrf_token": client.csrf, "action": "approve", "version": version.group(1)})
            with lock:
                counts["presses"] += 1
                if page.status_code == 409:
                    counts["conflicts"] += 1
                else:
                    seen[rid] = seen.get(rid, 0) + 1
                    counts["approved_twice"] += seen[rid] == 2
            if page.status_code == 409:  # as a reviewer would: the next answer from the queue
                page = client.get(f"{base}/review/results/{rid}?{queue}")

    threads = [threading.Thread(target=walk, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    per_100 = 100 * counts["conflicts"] / max(1, counts["presses"])
    return {**counts, "reviewers": len(names), "conflicts_per_100": round(per_100, 2), "seconds": round(elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--admin-url", default=DEFAULT_ADMIN)
    ap.add_argument("--redis-url", default=os.environ.get("VIDLORA_TEST_REDIS", "redis://127.0.0.1:6379/14"))
    ap.add_argument("--results", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--actions", type=int, default=20, help="Approve presses per reviewer")
    ap.add_argument("--out", default="bench/results/review_scale")
    a = ap.parse_args(argv)

    from sqlalchemy import text

    from bench.scratch_db import scratch_database

    scratch = ExitStack()
    scratch.enter_context(scratch_database(a.admin_url))
    os.environ.setdefault("VIDLORA_SECRET_KEY", uuid.uuid4().hex)
    os.environ.setdefault("VIDLORA_BROKER_URL", a.redis_url)
    server = None
    try:
        from werkzeug.serving import make_server

        from vidlora import db
        from vidlora.config import reset_settings
        from web import create_app
        from web.auth.tokens import create_token
        from web.auth.users import create_user, get_user

        reset_settings()
        db.upgrade()
        team = [f"reviewer{i}" for i in range(10)]
        with db.session_scope() as session:
            for user in team:
                create_user(session, user, PASSWORD)
        scenario = "catalogue_bench"
        t0 = time.perf_counter()
        seed(db.get_engine(), a.results, scenario)
        seeded_s = time.perf_counter() - t0
        with db.session_scope() as session:
            token = create_token(session, get_user(session, team[0]), "bench", "review").token
            some = session.execute(text("SELECT id FROM result ORDER BY id LIMIT 1 OFFSET :o"),
                                   {"o": a.results // 2}).scalar()
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
        app = create_app({"SECRET_KEY": os.environ["VIDLORA_SECRET_KEY"]})
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{server.server_port}"
        reader = signed_in(base, team[0])
        api = {"Authorization": f"Bearer {token}"}
        queue = f"scenario={scenario}&status=done&review_state=unreviewed&sort=uncertain"
        calls = {
            "page /results/ (all, newest)": ("GET", "/results/", {}),
            "page /results/ (the queue: unreviewed, least certain first)": ("GET", f"/results/?{queue}", {}),
            "page /results/ (search 'Ölgefäß')": ("GET", "/results/?q=Ölgefäß", {}),
            "page /results/ (a field condition)": ("GET", f"/results/?scenario={scenario}&where=finds.material%3Djade", {}),
            "page /results/ (page 1000)": ("GET", "/results/?page=1000", {}),
            "page /scenarios/": ("GET", "/scenarios/", {}),
            "page /batches/": ("GET", "/batches/", {}),
            "page /review/results/ID (from the queue)": ("GET", f"/review/results/{some}?queue=1&{queue}", {}),
            "api GET /results": ("GET", "/api/v1/results", {"headers": api}),
            "api GET /results (queue filter)": ("GET", f"/api/v1/results?{queue}", {"headers": api}),
            "api GET /results?page=1000": ("GET", "/api/v1/results?page=1000", {"headers": api}),
            "api GET /results/facets": ("GET", f"/api/v1/results/facets?scenario={scenario}", {"headers": api}),
            "api GET /results/ID": ("GET", f"/api/v1/results/{some}", {"headers": api}),
            "api GET /batches": ("GET", "/api/v1/batches", {"headers": api}),
        }
        results = []
        for label, (method, path, kwargs) in calls.items():
            client = reader if label.startswith("page") else __import__("requests")
            samples = timed(client, method, base + path, a.repeat, **kwargs)
            results.append({"call": label, "p95_ms": round(p95(samples), 1),
                            "median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1),
                            "n": len(samples)})
            print(f"{label:70s} p95 {results[-1]['p95_ms']:8.1f} ms", flush=True)

        # Approve, then the queue's next answer (the POST and the page it redirects to).
        approve = []
        page = reader.get(f"{base}/review/results/{some}?queue=1&{queue}")
        for _ in range(a.repeat):
            rid = re.search(r"/review/results/(\d+)", page.url).group(1)
            version = VERSION.search(page.text).group(1)
            t0 = time.perf_counter()
            page = reader.post(f"{base}/review/results/{rid}?queue=1&{queue}",
                               data={"csrf_token": reader.csrf, "action": "approve", "version": version})
            approve.append((time.perf_counter() - t0) * 1000)
            assert page.status_code == 200, page.status_code
        results.append({"call": "Approve, to the next answer in the queue", "p95_ms": round(p95(approve), 1),
                        "median_ms": round(statistics.median(approve), 1), "max_ms": round(max(approve), 1),
                        "n": len(approve)})
        print(f"{results[-1]['call']:70s} p95 {results[-1]['p95_ms']:8.1f} ms", flush=True)

        # The Scenarios page right after a review: its measures are scored again each time (the
        # view above mostly finds them kept, as long as nobody reviews).
        after_review = []
        for _ in range(a.repeat):
            rid = re.search(r"/review/results/(\d+)", page.url).group(1)
            version = VERSION.search(page.text).group(1)
            page = reader.post(f"{base}/review/results/{rid}?queue=1&{queue}",
                               data={"csrf_token": reader.csrf, "action": "approve", "version": version})
            after_review += timed(reader, "GET", f"{base}/scenarios/", 1)
        results.append({"call": "page /scenarios/ (first view after a review)", "p95_ms": round(p95(after_review), 1),
                        "median_ms": round(statistics.median(after_review), 1),
                        "max_ms": round(max(after_review), 1), "n": len(after_review)})
        print(f"{results[-1]['call']:70s} p95 {results[-1]['p95_ms']:8.1f} ms", flush=True)

        t0 = time.perf_counter()
        with __import__("requests").get(f"{base}/api/v1/results/export.csv", headers=api, stream=True) as export:
            rows = sum(chunk.count(b"\n") for chunk in export.iter_content(1 << 16)) - 1
        export_s = time.perf_counter() - t0
        print(f"export.csv of {rows} rows: {export_s:.1f} s", flush=True)

        conflicts = {}
        for size in (3, 10):
            conflicts[str(size)] = reviewers(base, team[:size], scenario, a.actions)
            print(f"{size} reviewers: {conflicts[str(size)]}", flush=True)

        summary = {
            "command": "python -m bench.review_scale " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "load_average_1_5_15": [round(x, 1) for x in os.getloadavg()],
            "results": a.results, "seeded_s": round(seeded_s, 1), "p95_ms": {r["call"]: r["p95_ms"] for r in results},
            "calls": results, "export_100k_s": round(export_s, 1), "export_rows": rows,
            "queue_conflicts_per_100": {k: v["conflicts_per_100"] for k, v in conflicts.items()},
            "queue_runs": conflicts, "target_p95_ms": 500,
        }
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        lines = [f"# Review at scale: {a.results:,} results", "", f"Command: `{summary['command']}`  ",
                 f"Machine: {summary['machine']}; load average at the end "
                 f"{' / '.join(map(str, summary['load_average_1_5_15']))} (1 / 5 / 15 min)", "",
                 "| page or call | p95 ms | median ms | slowest ms |", "|---|---:|---:|---:|"]
        lines += [f"| {r['call']} | {r['p95_ms']} | {r['median_ms']} | {r['max_ms']} |" for r in results]
        lines += ["", f"CSV export of {rows:,} rows: **{export_s:.1f} s**", "",
                  "| reviewers | Approve presses | conflicts | per 100 | approved twice |", "|---:|---:|---:|---:|---:|"]
        lines += [f"| {k} | {v['presses']} | {v['conflicts']} | {v['conflicts_per_100']} | {v['approved_twice']} |"
                  for k, v in conflicts.items()]
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print(json.dumps({k: summary[k] for k in ("export_100k_s", "queue_conflicts_per_100")}))
    finally:
        if server is not None:
            server.shutdown()
        scratch.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
