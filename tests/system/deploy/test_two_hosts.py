"""vidlora across hosts: the services, a CPU-worker host and a GPU-worker host, each a network
namespace with its own address on one LAN (tests/support/netns.py), as docs/deploy.md sets
them up.

- The services host runs PostgreSQL, Redis and the web app (gunicorn), listening on its LAN
  address only; the worker hosts reach them over the LAN, never over a loopback.
- The media store is one directory that each host mounts at a path of its own (as an NFS
  export is mounted on each host); every host's ``VIDLORA_MEDIA_ROOT`` is its own mount point.
- The test process is the operator's machine on the same LAN: it uploads through the web API
  with an API token, scrapes the workers' metrics on their hosts, and reads the database.

A batch crosses the hosts (web -> store -> CPU host -> store -> GPU host -> PostgreSQL); then
the GPU host's link goes down mid-batch and comes back, and `vidlora audit`, run on the
services host, finds nothing lost, duplicated or stuck.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from tests.support import netns
from tests.support.env import ROOT
from tests.support.fault_media import tiny_clips
from tests.support.fault_stack import PG_BIN, SCENARIOS_YAML, TIMINGS, PrivatePostgres, PrivateRedis, stop_services
from tests.support.reports import report
from tests.support.workers import WorkerProcess, describe_workers, scrape, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

GPU_WORKER = "gpuhost-gpu0"
WEB_PORT = 8000
METRICS_PORT = 9100  # every host has its own port space: the same port on each, as in compose
OPS_PASSWORD = "two hosts, one password"
TARGET_P95_S = 600
# The fault tests' scenarios, the quick one with a latency target.
SCENARIOS = SCENARIOS_YAML.replace("generation: {max_tokens: 4, temperature: 0.0, seed: 0}\n",
                                   "generation: {max_tokens: 4, temperature: 0.0, seed: 0}\n"
                                   f"    slo: {{p95_seconds: {TARGET_P95_S}}}\n", 1)
assert SCENARIOS != SCENARIOS_YAML


def _media_mount(root: Path, host: netns.Host) -> Path:
    return root / "mnt" / host.name / "media"


def _on(host: netns.Host, root: Path, shared: dict[str, str]) -> dict[str, str]:
    """A host's environment: the shared settings, with its own media mount and var dir."""
    return {**os.environ, **shared, "VIDLORA_MEDIA_ROOT": str(_media_mount(root, host)),
            "VIDLORA_VAR_DIR": str(root / "var" / host.name)}


@dataclass
class Deployment:
    lan: netns.Lan
    root: Path
    services: netns.Host
    cpu_host: netns.Host
    gpu_host: netns.Host
    shared_env: dict[str, str]  # the same on every host (docs/deploy.md: settings must agree)
    engine: object  # the operator's connection to PostgreSQL on the services host
    token: str = ""
    cpu: WorkerProcess | None = None
    gpu: WorkerProcess | None = None

    @property
    def api(self) -> str:
        return f"http://{self.services.address}:{WEB_PORT}/api/v1"

    def env(self, host: netns.Host) -> dict[str, str]:
        return _on(host, self.root, self.shared_env)

    def cli(self, host: netns.Host, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return host.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=self.env(host), input=stdin,
                        capture_output=True, text=True, timeout=180)

    def describe(self) -> str:
        return describe_workers(*(w for w in (self.cpu, self.gpu) if w is not None))


@pytest.fixture(scope="module")
def deployment(artifacts_dir) -> Iterator[Deployment]:
    why = netns.supported() or (None if (PG_BIN / "initdb").exists() and shutil.which("redis-server")
                                else "needs PostgreSQL 15 binaries and redis-server")
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="vidlora-hosts-"))
    root.chmod(0o755)  # PostgreSQL runs as its own user below it
    lan = netns.Lan()
    pg = redis_ = engine = web = None
    workers: list[WorkerProcess] = []
    try:
        lan.join_operator()
        services, cpu_host, gpu_host = lan.add_host("svc"), lan.add_host("cpu"), lan.add_host("gpu")
        store = root / "store"
        store.mkdir()
        for host in (services, cpu_host, gpu_host):
            host.mount(store, _media_mount(root, host))
            (root / "var" / host.name).mkdir(parents=True)
        (root / "scenarios.yaml").write_text(SCENARIOS)

        (root / "pg").mkdir()
        pg = PrivatePostgres(root / "pg", host=services)
        pg.start()
        pg.createdb("vidlora")
        redis_ = PrivateRedis(root, host=services)
        redis_.start(persistent=True)
        engine = create_engine(pg.url("vidlora"), pool_pre_ping=True)
        d = Deployment(lan, root, services, cpu_host, gpu_host, {
            **TIMINGS,
            "VIDLORA_DATABASE_URL": pg.url("vidlora"),
            "VIDLORA_BROKER_URL": redis_.url,
            "VIDLORA_SCENARIOS_FILE": str(root / "scenarios.yaml"),
            "VIDLORA_SECRET_KEY": secrets.token_hex(32),
            "VIDLORA_METRICS_PORT": str(METRICS_PORT),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }, engine)

        # The operator's first steps, on the services host: migrate, an account, a token.
        for args, stdin in [(("db", "upgrade"), None),
                            (("user", "create", "ops", "--password-stdin"), OPS_PASSWORD + "\n"),
                            (("token", "create", "ops", "--name", "two-hosts", "--scope", "review"), None)]:
            out = d.cli(services, *args, stdin=stdin)
            assert out.returncode == 0, out.stdout + out.stderr
        d.token = out.stdout.strip().splitlines()[-1]

        web_log_path = artifacts_dir / "two-hosts-web.log"
        web_log = web_log_path.open("wb")
        web = services.popen([sys.executable, "-m", "cli", "web", "--host", services.address, "--port", str(WEB_PORT),
                              "--workers", "1", "--threads", "4"], cwd=ROOT, env=d.env(services),
                             stdout=web_log, stderr=subprocess.STDOUT, start_new_session=True)
        d.cpu = WorkerProcess("cpu", artifacts_dir / "two-hosts-cpu.log", d.env(cpu_host),
                              ("--concurrency", "2", "--beat"), host=cpu_host)
        workers.append(d.cpu)
        d.gpu = WorkerProcess("gpu", artifacts_dir / "two-hosts-gpu.log",
                              {**d.env(gpu_host), "VIDLORA_WORKER_NAME": GPU_WORKER}, host=gpu_host)
        workers.append(d.gpu)
        wait_for(lambda: web.poll() is not None or _get(f"http://{services.address}:{WEB_PORT}/healthz"), 60,
                 what="web app")
        assert web.poll() is None, web_log_path.read_text()[-3000:]
        d.cpu.wait_ready(180)
        d.gpu.wait_ready(600)
        yield d
    finally:
        for worker in workers:
            worker.stop()
        if web is not None and web.poll() is None:
            os.killpg(web.pid, 15)
            web.wait(30)
        if engine is not None:
            engine.dispose()
        stop_services(pg, redis_)
        lan.close()
        shutil.rmtree(root, ignore_errors=True)


def _get(url: str, token: str | None = None):
    import requests

    try:
        response = requests.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=10)
    except requests.RequestException:
        return None
    return response if response.ok else None


def _upload(d: Deployment, clips: list[Path], scenario: str, name: str) -> int:
    import requests

    files = [("files", (clip.name, clip.read_bytes(), "video/mp4")) for clip in clips]
    response = requests.post(f"{d.api}/batches", headers={"Authorization": f"Bearer {d.token}"},
                             files=files, data={"scenarios": [scenario], "name": name}, timeout=60)
    assert response.status_code == 201, response.text
    return response.json()["batch_id"]


def _analyses(d: Deployment, batch_id: int):
    from sqlalchemy.orm import Session

    from vidlora.models import Analysis

    with Session(d.engine) as session:
        return session.scalars(select(Analysis).where(Analysis.batch_id == batch_id).order_by(Analysis.id)).all()


def _results_per_analysis(d: Deployment, batch_id: int) -> dict[int, int]:
    from sqlalchemy.orm import Session

    from vidlora.models import Analysis, Result

    with Session(d.engine) as session:
        return dict(session.execute(select(Result.analysis_id, func.count()).join(Analysis)
                                    .where(Analysis.batch_id == batch_id).group_by(Result.analysis_id)).all())


def _batch_over(d: Deployment, batch_id: int, videos: int):
    """The batch as the API reports it, once every analysis is final."""
    response = _get(f"{d.api}/batches/{batch_id}", d.token)
    if response is None:
        return None
    view = response.json()
    analyses = [a for v in view["videos"] for a in v["analyses"]]
    over = len(view["videos"]) == videos and not view["uploads_pending"] and analyses and all(
        a["status"] in ("done", "failed", "rejected") for a in analyses)
    return view if over else None


def _audit(d: Deployment, *batch_ids: int) -> dict[str, int]:
    out = d.cli(d.services, "audit", *map(str, batch_ids))
    counts = {line.split()[0]: int(line.split()[1]) for line in out.stdout.splitlines() if line.strip()}
    assert out.returncode == 0 and counts and not any(counts.values()), out.stdout + out.stderr
    return counts


@pytest.fixture(scope="module")
def clips(corpus_dir) -> list[Path]:
    return tiny_clips(corpus_dir / "two-hosts", 12)


def test_a_batch_crosses_the_hosts(deployment: Deployment, clips):
    d = deployment
    # Nothing of the services is on the worker hosts' loopback: they reach it over the LAN.
    probe = d.gpu_host.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "ping"], capture_output=True, text=True)
    assert "PONG" not in probe.stdout

    batch_id = _upload(d, clips[:3], "fault_quick", "crossing")
    view = wait_for(lambda: _batch_over(d, batch_id, 3), 300, 1, "the batch to finish", diagnose=d.describe)
    analyses = _analyses(d, batch_id)
    assert [a.status for a in analyses] == ["done"] * 3, [(a.id, a.status, a.reason) for a in analyses]
    assert {a.worker for a in analyses} == {GPU_WORKER}
    assert _results_per_analysis(d, batch_id) == {a.id: 1 for a in analyses}
    # The frames the GPU host read were written by the CPU host into the shared store.
    assert all(v["has_frames"] for v in view["videos"])

    # Each host's metrics, scraped from the operator's machine at the host's own address.
    gpu = scrape(f"http://{d.gpu_host.address}:{METRICS_PORT}/metrics")
    done = gpu.get(("vidlora_analyses_finished_total", (("scenario", "fault_quick"), ("status", "done"))), 0)
    assert done >= 3, {k: v for k, v in gpu.items() if k[0].startswith("vidlora_analyses")}
    cpu = scrape(f"http://{d.cpu_host.address}:{METRICS_PORT}/metrics")
    assert cpu.get(("vidlora_decode_cpu_seconds_count", ()), 0) >= 3
    _audit(d, batch_id)


def test_gpu_host_cut_off_mid_batch_and_restored(deployment: Deployment, clips):
    d = deployment
    batch_id = _upload(d, clips[3:9], "fault_slow", "link-cut")

    def running():
        return [a.id for a in _analyses(d, batch_id) if a.status == "running"] or None

    running_ids = wait_for(running, 300, 0.05, "analyses running on the GPU host", diagnose=d.describe)
    d.lan.cut(d.gpu_host)
    cut_at = time.monotonic()
    try:
        # Cut off, the GPU host can store nothing; its heartbeat stops, so the reconciler (on
        # the CPU host) takes its running analyses back for another worker.
        def taken_back():
            rows = {a.id: a for a in _analyses(d, batch_id)}
            return all(rows[i].status != "running" or rows[i].worker != GPU_WORKER for i in running_ids)

        wait_for(taken_back, 120, 1, "the reconciler to take the cut-off host's analyses back", diagnose=d.describe)
        stored_while_cut = [i for i in running_ids if i in _results_per_analysis(d, batch_id)]
        assert not stored_while_cut, "a host without a link cannot have stored results"
    finally:
        d.lan.restore(d.gpu_host)
    restored_at = time.monotonic()

    # Back on the LAN the same worker (same process: nothing restarted it) finishes the batch.
    wait_for(lambda: _batch_over(d, batch_id, 6), 600, 1, "the batch to finish after the link came back",
             diagnose=d.describe)
    finished_at = time.monotonic()
    assert d.gpu.proc.poll() is None, "the GPU worker must live through a link cut"
    analyses = _analyses(d, batch_id)
    assert [a.status for a in analyses] == ["done"] * 6, [(a.id, a.status, a.reason) for a in analyses]
    assert _results_per_analysis(d, batch_id) == {a.id: 1 for a in analyses}
    # An analysis running at the cut is either run again after the reconciler took it back, or
    # its answer, finished during the cut, is stored once when the link comes back (the worker
    # keeps retrying the store; tasks.analysis_rows.store): exactly one result either way, above.
    rerun = [a.id for a in analyses if a.id in running_ids and a.attempts >= 2]
    kept = [a.id for a in analyses if a.id in running_ids and a.attempts == 1]
    counts = _audit(d, batch_id)
    report("two hosts", f"GPU host cut off {restored_at - cut_at:.0f} s with {len(running_ids)} analyses running "
           f"({len(kept)} answers finished in the cut stored after it, {len(rerun)} run again); "
           f"batch finished {finished_at - restored_at:.0f} s after the link came back; audit {counts}")


def test_latency_of_this_run_per_scenario_on_the_scenarios_page_and_the_cli(deployment: Deployment):
    """P50/P95 from the analyses the two batches above really ran, read the two ways an
    operator reads them: `vidlora status --latency` and the Scenarios page."""
    import re

    import requests

    d = deployment
    out = d.cli(d.services, "status", "--latency", "--window", "1h", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r["scenario"]: r for r in json.loads(out.stdout)["scenarios"]}
    quick, slow = rows["fault_quick"], rows["fault_slow"]
    assert (quick["count"], slow["count"]) == (3, 6)
    for row in (quick, slow):
        assert 0 < row["p50_total_s"] <= row["p95_total_s"] and 0 < row["p50_engine_s"] <= row["p95_engine_s"], row
    # The slow batch waited out a link cut: its P95 shows it.
    assert slow["p95_total_s"] > quick["p95_total_s"]
    assert (quick["target_p95_s"], quick["target_met"]) == (TARGET_P95_S, True)
    assert slow["target_p95_s"] is None

    web = requests.Session()
    login = web.get(f"http://{d.services.address}:{WEB_PORT}/auth/login", timeout=10).text
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', login).group(1)
    signed_in = web.post(f"http://{d.services.address}:{WEB_PORT}/auth/login", timeout=10,
                         data={"username": "ops", "password": OPS_PASSWORD, "csrf_token": csrf})
    assert signed_in.ok and "Sign out" in signed_in.text, signed_in.text[:500]
    page = web.get(f"http://{d.services.address}:{WEB_PORT}/scenarios/?window=1h", timeout=10).text
    assert 'data-scenario="fault_quick" data-count="3" data-target-met="true"' in page
    assert 'data-scenario="fault_slow" data-count="6" data-target-met="null"' in page
