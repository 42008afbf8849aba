"""Friendly error pages for people, JSON errors for the API and for XHR/fetch callers."""

from __future__ import annotations

from flask import Flask, jsonify, render_template, request, session
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException, InternalServerError, RequestEntityTooLarge

from web.template_helpers import human_bytes

MESSAGES = {
    400: ("Something in that request was not right", "Please go back and try again."),
    401: ("Please sign in", "You need to sign in to do that."),
    403: ("Not allowed", "Your account may not do that."),
    404: ("Not found", "There is nothing here. It may have been removed, or the link is wrong."),
    405: ("Not allowed", "That page cannot be used this way."),
    409: ("Changed since you read it", "Someone else changed this since you loaded it. Reload and try again."),
    412: ("No such version", "The version you named is not one this result ever had. Read it again."),
    413: ("Upload too large", ""),
    415: ("Unsupported content type", "Send the body in the content type the API document names."),
    428: ("Say which version you read", "Send If-Match with the ETag of what you read."),
    503: ("A service is unavailable", "Part of vidlora cannot be reached right now. Please try again in a moment."),
    500: ("Something went wrong on our side", "The error has been logged. Please try again in a moment."),
}


def wants_json() -> bool:
    if request.path.startswith("/api/"):
        return True
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "application/json" and request.accept_mimetypes[best] > request.accept_mimetypes["text/html"]


def _too_large_message(app: Flask) -> str:
    limit = app.config.get("MAX_CONTENT_LENGTH")
    size = human_bytes(limit) if limit else "the limit"
    return (f"The upload is larger than the limit of {size} per upload. Send fewer files at once, "
            "or ask an administrator to enqueue very large archives from the command line.")


def render_error(code: int, detail: str | None = None):
    title, text = MESSAGES.get(code, ("Error", ""))
    text = detail or text
    if wants_json():
        return jsonify(error=title, detail=text, status=code), code
    return render_template("errors/error.html", code=code, title=title, detail=text), code


def init_app(app: Flask) -> None:
    render = render_error

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError):
        # 403: the request is understood and refused (what the API documents). A cross-site
        # post arrives without the session cookie (SameSite=Lax); the page's own CSRF meta tag
        # would start a fresh session, and its cookie would replace the victim's: signed out
        # by someone else's page. So this answer never sets a cookie.
        # Logged with why, so an operator behind a new proxy can see what the app saw.
        app.logger.warning("refused %s %s from %s: %s (Host %s, Origin %s, Referer %s)", request.method, request.path,
                           request.remote_addr, exc.description, request.host, request.headers.get("Origin"),
                           request.referrer)
        response = render(403, "This form has expired or was not sent from this site. "
                               "Reload the page and try again.")
        session.modified = False
        return response

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge):
        return render(413, _too_large_message(app))

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code in (301, 302, 303, 307, 308) or exc.code is None:
            return exc
        # abort(404, "No batch 7") gives its own text; werkzeug's stock text is replaced.
        detail = exc.description if exc.description != type(exc).description else None
        response = render(exc.code, detail)
        if exc.code == 405 and getattr(exc, "valid_methods", None):
            response = (response[0], response[1], {"Allow": ", ".join(exc.valid_methods)})
        return response

    try:
        from redis.exceptions import ConnectionError as RedisDown, TimeoutError as RedisSlow
    except ImportError:  # pragma: no cover - redis ships with vidlora; the demo never calls it
        pass
    else:
        @app.errorhandler(RedisDown)
        @app.errorhandler(RedisSlow)
        def redis_down(exc: Exception):
            # The sign-in throttle and the task queue live in Redis: without it nobody can be
            # let in safely. Say so in words (and when to retry), not "something went wrong".
            app.logger.error("Redis cannot be reached: %s: %s", type(exc).__name__, exc)
            response = render(503, "Redis (the store behind sign-in and the task queue) cannot be reached, "
                                   "so signing in and starting batches are unavailable right now. Nothing "
                                   "you sent was saved. Try again in a minute; an administrator can see "
                                   "what is down at /healthz or with `vidlora doctor`.")
            return response[0], 503, {"Retry-After": "30"}

    @app.errorhandler(InternalServerError)
    def server_error(exc: InternalServerError):
        return render(500)
