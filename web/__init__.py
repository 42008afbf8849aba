"""The vidlora web app: upload, progress, frames, review, query, and a JSON API.

``create_app(test_config=None)`` follows the flaskr factory: defaults from vidlora's typed
settings, overridden by a test dict; extensions bound with ``init_app``; one blueprint per
feature. The app is a thin layer over the database: batches start through
``tasks.submit.submit_streams`` and progress is read with ``vidlora.status.batch_view``.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from flask import Flask
from werkzeug.routing import IntegerConverter

from vidlora.config import get_settings

log = logging.getLogger(__name__)


class RowId(IntegerConverter):
    """``<id:name>`` in a route: a row id, positive and within PostgreSQL's integer; anything
    else matches no route (404), never reaches the database as an out-of-range error."""

    def __init__(self, url_map):
        super().__init__(url_map, min=1, max=2**31 - 1)


class InsecureSecretKey(RuntimeError):
    """Refusing to sign sessions with an empty or guessable secret outside development."""


MIN_SECRET_CHARS = 32
PLACEHOLDERS = ("change-me", "changeme", "change_me", "secret", "password")


def _secret_key(app: Flask, dev: bool) -> str:
    if app.config.get("SECRET_KEY"):
        return app.config["SECRET_KEY"]  # given by the caller (tests)
    key = get_settings().secret_key
    weak = key and (len(key) < MIN_SECRET_CHARS or any(p in key.lower() for p in PLACEHOLDERS))
    if key and not (weak and not (app.testing or dev)):
        return key
    if weak:
        # Anyone who knows the example value could sign a session as any user.
        raise InsecureSecretKey(
            f"VIDLORA_SECRET_KEY looks like a placeholder or is shorter than {MIN_SECRET_CHARS} characters. "
            "Set it to a long random value (for example the output of "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`).")
    if app.testing or dev:
        # A per-process key: sessions do not survive a restart, which is fine for a demo.
        app.logger.warning(
            "VIDLORA_SECRET_KEY is not set: using a random secret key for this development "
            "server only; logins end when it restarts. Set VIDLORA_SECRET_KEY in production."
        )
        return secrets.token_hex(32)
    raise InsecureSecretKey(
        "VIDLORA_SECRET_KEY is empty. Set it to a long random value (for example the output of "
        "`python -c 'import secrets; print(secrets.token_hex(32))'`), or start the development "
        "server with `vidlora web --dev`."
    )


def create_app(test_config: dict[str, Any] | None = None, dev: bool = False, warm: bool = True) -> Flask:
    """Build the app. ``dev=True`` allows a random secret key (embedded demo only). ``warm``:
    start warming the Scenarios measures here; False where the process forks its servers next
    (``vidlora web``: a fork while that thread is importing or connecting leaves the workers a
    half-imported driver), which then warm each in its own worker."""
    settings = get_settings()
    app = Flask(__name__)
    from web.json_input import StrictJSONProvider

    app.json = StrictJSONProvider(app)
    app.config.from_mapping(
        MAX_CONTENT_LENGTH=settings.max_upload_bytes,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        REMEMBER_COOKIE_HTTPONLY=True,
        REMEMBER_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.session_cookie_secure,
        REMEMBER_COOKIE_SECURE=settings.session_cookie_secure,
        # CSRF is enforced in web.security (so token-authenticated API calls can skip it);
        # the token itself lives for the session, not one hour: reviewers keep tabs open.
        WTF_CSRF_CHECK_DEFAULT=False,
        WTF_CSRF_TIME_LIMIT=None,
        # The origin is checked in web.security, against the address behind the proxies.
        WTF_CSRF_SSL_STRICT=False,
        PROXY_HOPS=settings.proxy_hops,
        PAGE_SIZE=50,
        POLL_INTERVAL_MS=2000,
    )
    if test_config is not None:
        app.config.from_mapping(test_config)
    app.config["SECRET_KEY"] = _secret_key(app, dev)
    app.url_map.converters["id"] = RowId
    if settings.proxy_hops > 0:
        from werkzeug.middleware.proxy_fix import ProxyFix

        # Only the hops the operator named: the client address the sign-in throttle counts, and
        # the host and port the browser used (what the form's origin is checked against).
        hops = settings.proxy_hops
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops)
        from web.proxy import DirectRequests, redis_recorder

        # ... and a request that bypassed them says the setting can be forged (log, doctor).
        remember = redis_recorder(settings.broker_url) if settings.broker_url.startswith("redis") else (lambda _: None)
        app.wsgi_app = DirectRequests(app.wsgi_app, settings.proxy_hops, remember)

    from web import database, errors, security, template_helpers
    from web.extensions import csrf, login_manager

    database.init_app(app)
    csrf.init_app(app)
    login_manager.init_app(app)
    security.init_app(app)
    errors.init_app(app)
    template_helpers.init_app(app)

    from web.accounts import bp as accounts_bp
    from web.api import bp as api_bp
    from web.auth import bp as auth_bp
    from web.batches import bp as batches_bp
    from web.query import bp as query_bp
    from web.review import bp as review_bp
    from web.scenarios import bp as scenarios_bp
    from web.upload import bp as upload_bp
    from web.videos import bp as videos_bp

    for bp in (auth_bp, upload_bp, batches_bp, videos_bp, review_bp, query_bp, scenarios_bp, accounts_bp, api_bp):
        app.register_blueprint(bp)
    app.add_url_rule("/", endpoint="index", view_func=_index)
    app.add_url_rule("/healthz", endpoint="healthz", view_func=_healthz)
    app.add_url_rule("/metrics", endpoint="metrics", view_func=_metrics)
    from web.scenarios.warm import warm_in_background

    app.extensions["vidlora_warm_measures"] = warm_in_background() if warm else None  # the thread, or None
    return app


def _metrics():
    """Prometheus scrape of the state, read from PostgreSQL and Redis now (the workers serve
    their event metrics themselves). Behind VIDLORA_METRICS_TOKEN, or open with
    VIDLORA_METRICS_PUBLIC=true; closed by default."""
    import hmac

    from flask import Response, abort, request
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

    from tasks.celery_app import CONTROL_QUEUE, CPU_QUEUE, GPU_QUEUE
    from vidlora.config import get_settings
    from vidlora.db import session_scope
    from vidlora.metrics import StateCollector, scrape

    settings = get_settings()
    if settings.metrics_token:
        sent = request.authorization.token if request.authorization and request.authorization.type == "bearer" else ""
        if not hmac.compare_digest((sent or "").encode(), settings.metrics_token.encode()):
            abort(401, "This endpoint wants the metrics token (Authorization: Bearer).")
    elif not settings.metrics_public:
        abort(403, "Metrics are closed: set VIDLORA_METRICS_TOKEN (and scrape with it), or "
                   "VIDLORA_METRICS_PUBLIC=true where only your Prometheus can reach this address.")
    redis_client = None
    if settings.broker_url.startswith("redis"):
        import redis

        redis_client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
    registry = CollectorRegistry()
    registry.register(StateCollector(session_scope, redis_client, (CPU_QUEUE, CONTROL_QUEUE), GPU_QUEUE))
    return Response(scrape(registry), mimetype=CONTENT_TYPE_LATEST)


def _healthz():
    """Health for load balancers and compose: the app answers and reaches what it needs, the
    database and (where the broker is Redis) Redis, which sign-in and new batches need. 503
    names what is down, so an operator reads the cause, not just "unhealthy"."""
    from sqlalchemy import text

    from vidlora.config import get_settings
    from vidlora.db import get_engine

    checks: dict[str, str] = {}
    try:
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
        checks["database"] = f"down: {type(exc).__name__}"
    url = get_settings().broker_url
    if url.startswith("redis"):
        import redis

        try:
            redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping()
            checks["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means "not healthy"
            checks["redis"] = f"down: {type(exc).__name__}"
    down = [name for name, state in checks.items() if state != "ok"]
    if down:
        return {"ok": False, "down": down, **checks,
                "error": f"{' and '.join(down)} cannot be reached"}, 503
    return {"ok": True, **checks}


def _index():
    from flask import redirect, url_for

    return redirect(url_for("batches.index"))
