"""All of vidlora's settings, in one typed place, read from the environment.

Every process (CLI, web, cpu worker, gpu worker) calls ``get_settings()``; nothing else reads
``os.environ`` for configuration. Defaults are the embedded set-up (SQLite file, SQLite-backed
queue, local media folder, the demo model shipped in ``demo_model/weights``), so a fresh checkout runs with
no external services. Production sets ``VIDLORA_DATABASE_URL`` / ``VIDLORA_BROKER_URL`` to
PostgreSQL and Redis and points ``VIDLORA_MODEL`` / ``VIDLORA_ADAPTER_ROOT`` at real weights.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The demo model and its scenario adapters (demo_model.train): small enough to ship, and it
# answers the generated scenes correctly, so a working install is visibly one.
DEMO_MODEL = PROJECT_ROOT / "demo_model" / "weights"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIDLORA_", env_file=None, extra="ignore")

    # -- where things live -------------------------------------------------------------
    var_dir: Path = Field(PROJECT_ROOT / "var", description="Root for embedded state.")
    database_url: str = ""  # default: sqlite file under var_dir
    broker_url: str = ""  # default: kombu's SQLAlchemy transport on a sqlite file
    media_root: Path | None = None  # default: var_dir / "media"
    scenarios_file: Path = PROJECT_ROOT / "scenarios.yaml"

    # -- model -------------------------------------------------------------------------
    model: str = ""  # default: the demo model (DEMO_MODEL / "base")
    adapter_root: Path | None = None  # adapter paths in scenarios.yaml are relative to it
    # Normalised adapters (engine_patch.registration) are written here; local to each worker.
    adapter_cache_dir: Path | None = None  # default: var_dir / "prepared-adapters"
    # An adapter whose files or folder are links to places outside the adapter root is refused:
    # an adapter path could otherwise read any file of the server. Set where links are curated.
    adapter_links_outside_root: bool = False
    served_model_name: str = ""

    # -- ingest limits (bulk archives are hostile until proven otherwise) ---------------
    max_upload_bytes: int = 2 * 1024**3
    max_video_bytes: int = 2 * 1024**3
    archive_max_members: int = 5_000
    archive_max_total_bytes: int = 20 * 1024**3
    archive_max_ratio: float = 200.0  # uncompressed / compressed, per member
    archive_nested: str = "reject"  # "reject" | "extract" (one level only)
    # A file given by path (or an archive) must keep its size and modification time this long
    # before it is taken: a recording still being written is refused with a reason, not
    # analysed as far as it had got. Files untouched for this long are taken at once.
    ingest_settle_s: float = Field(2.0, ge=0.0)
    # Names the decoders read (the probe judges the content): containers, and the raw
    # elementary streams cameras and tools write (.mpv/.m2v MPEG video, .h264/.hevc).
    video_extensions: tuple[str, ...] = (
        ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".mts", ".m2ts",
        ".wmv", ".asf", ".flv", ".f4v", ".3gp", ".3g2", ".ogv", ".ogg", ".vob", ".mxf", ".dv",
        ".mpv", ".m1v", ".m2v", ".h264", ".264", ".hevc", ".h265", ".265", ".ivf", ".y4m",
    )

    # -- resumable uploads (tus; vidlora.resumable) -------------------------------------
    # One file's cap: no limit but the disk's in spirit (a camcorder day is tens of GB).
    resumable_max_bytes: int = 500 * 1024**3
    # A chunk is refused (507) unless this much stays free after it: the store keeps room
    # for the frames and the work already accepted.
    resumable_min_free_bytes: int = 1024**3
    # An upload no chunk has reached for this long is expired by the reconciler, its bytes
    # deleted (a complete one never handed to a batch, too).
    resumable_expire_after_s: float = 7 * 24 * 3600.0
    # What the upload page and `vidlora upload` send per request (a proxy in front may cap
    # request bodies); the server takes any size up to the file's end.
    resumable_chunk_bytes: int = 64 * 1024**2
    # `vidlora upload` (a client of a remote vidlora): its API token, and where it keeps each
    # file's upload URL so a killed run resumes (default: the user's cache folder).
    api_token: str = ""
    upload_cache_dir: Path | None = None

    # -- probing / sampling -------------------------------------------------------------
    max_video_pixels: int = 8192 * 8192  # "absurd resolution" above this
    max_duration_s: float = 6 * 3600.0
    decode_timeout_s: float = 120.0  # a decoder subprocess is killed after this
    jpeg_quality: int = 90

    # -- task behaviour -------------------------------------------------------------------
    max_attempts: int = 3  # attempt cap kept in the database, not in the broker
    cpu_soft_time_limit_s: int = 600
    cpu_time_limit_s: int = 660
    gpu_batch_deadline_s: int = 1800
    # Must exceed the longest task, or Redis re-delivers a task that is still running.
    visibility_timeout_s: int = 7200
    # Work untouched this long is presumed orphaned (its message lost with a broker restart,
    # its worker dead) and re-sent by the reconciler. Re-sending is safe: tasks are idempotent.
    stale_after_s: float = 900.0
    reconcile_every_s: float = 60.0

    # -- GPU worker / engine --------------------------------------------------------------
    max_loras: int = 4
    max_cpu_loras: int = 20
    max_lora_rank: int = 64
    max_model_len: int = 16384
    # Sequences the engine runs at once (one GDN state slot each). The streaming GPU worker
    # keeps this many in flight where the KV cache holds them (measured on the H200: 256 in
    # flight does 3.5x the analyses of 16 at the shipped scenarios' shape).
    max_num_seqs: int = 64
    # Tokens one engine step may schedule (prefill chunks beside decodes); 0 keeps vLLM's
    # default. On the H200 at ~2,000-token video prompts 32,768 did 1.26x the default's
    # analyses/s with 64 in flight (bench/results/streaming_h200.md).
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.9
    # A fixed KV-cache size instead of a share of device memory (vLLM's kv_cache_memory_bytes):
    # for a device shared with other processes. On CPU without VLLM_CPU_KVCACHE_SPACE the
    # engine host uses 1 GiB.
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    # Weights in FP8 (vLLM's online quantization of a bf16 checkpoint): half the weight memory,
    # so the cache left holds ~3x the sequences on an 80 GB card with a 27B model
    # (bench/results/fit_80gb.md). A checkpoint published in FP8 (its config.json carries a
    # quantization_config, e.g. Qwen3.6-27B-FP8) is FP8 without this. Adapters stay bf16 and
    # are verified against the bf16 base (docs/deploy.md, "An 80 GB card").
    quantization: Literal["", "fp8"] = ""
    # The attention layers' KV cache in FP8 ("fp8": about half the cache per token of attention).
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    # The Gated-DeltaNet recurrent state (vLLM's mamba_ssm_cache_dtype): "auto" takes the
    # checkpoint's own choice (Qwen3.5's config may ask for float32); the state is most of what
    # one running analysis holds, so its dtype sets the batch.
    gdn_state_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    # The grammar engine that enforces scenarios' output schemas. Structured answers are
    # generated compact (no whitespace between JSON tokens): a model may otherwise spend its
    # whole max_tokens on grammar-legal blanks inside an unfinished answer.
    structured_outputs_backend: Literal["xgrammar", "guidance"] = "xgrammar"
    # How the engine gets its weights: "auto" reads the checkpoint; "dummy" fills the model's
    # shape with random values (vLLM's load_format), for sizing a GPU host before the
    # checkpoint is there: kernels, shapes and memory are the real model's, the answers are
    # noise. The adapter checks that judge answers against the base (effect, canary) cannot
    # judge noise, so a dummy engine registers adapters on their host checks alone.
    load_format: Literal["auto", "dummy"] = "auto"
    # The Gated-DeltaNet prefill kernels (vLLM's gdn_prefill_backend); "" keeps vLLM's choice.
    # "triton" where FlashInfer is not installed (a vLLM build carried without it).
    gdn_prefill_backend: Literal["", "triton", "flashinfer"] = ""
    # -- the GPU worker's loop -----------------------------------------------------------
    # "stream" (tasks.gpu_stream): analyses stream into the running engine, admitted while it
    # has room, each result stored as it finishes. "batch": one task runs one closed engine
    # batch and waits for its slowest request (the engine drains between batches).
    gpu_worker_mode: Literal["stream", "batch"] = "stream"
    # Analyses in flight on one engine: 0 derives it (max_num_seqs, bounded by the KV and
    # GDN-state blocks one analysis of the scenarios' shape holds, read from the engine:
    # vidlora.admission.concurrency); > 0 caps it.
    stream_max_in_flight: int = 0
    # An adapter whose oldest analysis has waited this long for a slot goes next, and nothing
    # newer overtakes it (vidlora.admission.admit).
    stream_fair_wait_s: float = 30.0
    # A graceful stop finishes what is in flight within this budget, then gives the rest back.
    gpu_drain_s: float = 60.0
    batch_max_requests: int = 16
    batch_max_tokens: int = 65536
    # A partly filled batch waits at most this long for more analyses of its adapter.
    dispatch_max_wait_s: float = 5.0
    worker_name: str = ""  # default: hostname-pid
    heartbeat_s: float = 15.0
    # -- metrics (vidlora.metrics) -----------------------------------------------------------
    metrics_port: int = 0  # a worker serves its Prometheus metrics here (0: off)
    metrics_token: str = ""  # the web app's /metrics wants "Authorization: Bearer <it>"
    # /metrics shows scenario names, counts and worker states: without a token it answers
    # only when the operator says it may be public (e.g. reachable only by their Prometheus).
    metrics_public: bool = False
    # An adapter whose outputs stay degenerate after the whole recovery ladder this many
    # times is quarantined: its analyses fail at once instead of burning GPU time.
    guard_quarantine_after: int = 2
    # The guard's last recovery step: "auto" rebuilds the engine in-process when closing it
    # frees the device memory, else the worker exits for its supervisor to restart it;
    # "replace" always restarts the worker process.
    engine_rebuild: str = "auto"
    # The GPU worker's start-up checks through its engine (engine_patch.startup_checks): seconds
    # on a GPU. Off only where something else covers them (the test suite's many worker starts).
    startup_checks: bool = True

    # -- the feedback loop (vidlora.feedback) ---------------------------------------------
    # A number in a structured answer counts as right within this share of its schema range
    # (confidence in 0..1: +-0.05), or of the reviewed value where the schema gives no range.
    eval_number_tolerance: float = 0.05
    # An adapter version's confidence is shown calibrated (vidlora.feedback.calibration) once
    # this many of its answers with a confidence were reviewed or answered the gold set.
    calibration_min_answers: int = 50

    # -- web ---------------------------------------------------------------------------
    secret_key: str = ""  # must be set outside development; see web.create_app
    # Behind HTTPS (a TLS-terminating proxy): browsers then send the session cookies only
    # over HTTPS, so a plain-HTTP request can never leak them.
    session_cookie_secure: bool = False
    # Reverse proxies in front of the web app that append to X-Forwarded-For (a TLS proxy: 1).
    # The sign-in throttle counts per client address; with 0 it trusts no such header (anyone
    # could forge it) and every client behind a proxy would share the proxy's address.
    proxy_hops: int = 0
    # A reviewer who opens an answer from the review queue holds it this long (web.review.leases);
    # the open page renews it every third of this, and leaving the page lets it go. Others
    # are handed the next free answer meanwhile; nobody is ever stopped from reviewing it.
    review_lease_s: int = Field(default=90, ge=15, le=3600)
    # Each web process scores the scenarios' reviewed answers once as it starts, in the
    # background (web.scenarios.warm), so the first Scenarios view after a deploy or restart
    # finds its measures ready instead of paying for them (~0.5 s per 10,000 reviewed answers).
    warm_measures_on_start: bool = True
    web_host: str = "127.0.0.1"
    web_port: int = 8000

    @model_validator(mode="after")
    def _fill_defaults(self) -> "Settings":
        self.var_dir = Path(self.var_dir)
        # The URL everyone writes first; SQLAlchemy would read it as psycopg2, which is not
        # installed ("No module named psycopg2"): psycopg 3 is the driver vidlora ships.
        for scheme in ("postgresql://", "postgres://"):
            if self.database_url.startswith(scheme):
                self.database_url = "postgresql+psycopg://" + self.database_url[len(scheme):]
        if not self.database_url:
            self.database_url = f"sqlite:///{self.var_dir / 'vidlora.db'}"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{self.var_dir / 'broker.db'}"
        if self.media_root is None:
            self.media_root = self.var_dir / "media"
        if not self.model:
            self.model = str(DEMO_MODEL / "base")
        if self.adapter_root is None:
            self.adapter_root = DEMO_MODEL / "adapters"
        if self.upload_cache_dir is None:
            cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            self.upload_cache_dir = Path(cache_home) / "vidlora"
        if self.adapter_cache_dir is None:
            self.adapter_cache_dir = self.var_dir / "prepared-adapters"
        if self.engine_rebuild not in ("auto", "replace"):
            raise ValueError("engine_rebuild must be 'auto' or 'replace'")
        if self.archive_nested not in ("reject", "extract"):
            raise ValueError("archive_nested must be 'reject' or 'extract'")
        if self.cpu_time_limit_s <= self.cpu_soft_time_limit_s:
            raise ValueError("cpu_time_limit_s must exceed cpu_soft_time_limit_s")
        if self.visibility_timeout_s <= max(self.cpu_time_limit_s, self.gpu_batch_deadline_s):
            raise ValueError("visibility_timeout_s must exceed the longest task")
        if self.stale_after_s <= self.cpu_time_limit_s:
            raise ValueError("stale_after_s must exceed cpu_time_limit_s, or running work is re-sent")
        return self

    @property
    def is_embedded(self) -> bool:
        return self.database_url.startswith("sqlite") or self.broker_url.startswith("sqla+")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings() -> None:
    """Forget the cached settings (tests change the environment between cases)."""
    get_settings.cache_clear()
