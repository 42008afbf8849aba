"""CLI commands of the web app, registered on the `vidlora` group by cli/main.py:

    vidlora user create NAME [--password-stdin]   create a reviewer account
    vidlora user set-password NAME [--password-stdin]
    vidlora web [--dev] [--host H] [--port P] [--workers N]

Imports stay inside the commands so `vidlora --help` does not load Flask.
"""

from __future__ import annotations

import sys

import click


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


@click.group("user")
def user_group() -> None:
    """Reviewer accounts for the web app."""


@user_group.command("create")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def user_create(username: str, password_stdin: bool) -> None:
    """Create a user who can sign in to the web app."""
    from vidlora.db import session_scope
    from web.auth.users import UserError, create_user

    password = _read_password(password_stdin)
    try:
        with session_scope() as session:
            create_user(session, username, password)
    except UserError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"user {username} created")


@user_group.command("set-password")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def user_set_password(username: str, password_stdin: bool) -> None:
    """Give an existing user a new password."""
    from vidlora.db import session_scope
    from web.auth.users import UserError, set_password

    password = _read_password(password_stdin)
    try:
        with session_scope() as session:
            set_password(session, username, password)
    except UserError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"password of {username} changed")


@click.command("web")
@click.option("--host", default=None, help="Address to listen on (default: VIDLORA_WEB_HOST).")
@click.option("--port", default=None, type=int, help="Port (default: VIDLORA_WEB_PORT).")
@click.option("--workers", default=2, show_default=True, help="gunicorn worker processes.")
@click.option("--threads", default=8, show_default=True, help="Threads per worker (uploads are slow clients).")
@click.option("--dev", is_flag=True,
              help="Development server; allows an empty VIDLORA_SECRET_KEY (a random one is used).")
def web_command(host: str | None, port: int | None, workers: int, threads: int, dev: bool) -> None:
    """Serve the web app (gunicorn; --dev: Flask's development server)."""
    from vidlora.config import get_settings
    from web import InsecureSecretKey, create_app

    settings = get_settings()
    host, port = host or settings.web_host, port or settings.web_port
    try:
        app = create_app(dev=dev)
    except InsecureSecretKey as exc:
        raise click.ClickException(str(exc)) from exc
    if dev:
        app.run(host=host, port=port, debug=False, threaded=True)
        return
    _serve_gunicorn(app, f"{host}:{port}", workers, threads, settings.cpu_time_limit_s)


def _serve_gunicorn(app, bind: str, workers: int, threads: int, timeout: int) -> None:
    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        def load_config(self) -> None:
            # Long timeout: a large upload is one long request while it is copied into the store.
            for key, value in {"bind": bind, "workers": workers, "threads": threads,
                               "worker_class": "gthread", "timeout": timeout, "accesslog": "-"}.items():
                self.cfg.set(key, value)

        def load(self):
            return app

    Server().run()
