"""CLI commands of the web app, registered on the `vidlora` group by cli/main.py:

    vidlora user create NAME [--role admin] [--password-stdin]
    vidlora user list | set-password NAME | reset NAME | deactivate NAME | activate NAME
    vidlora user role NAME reviewer|admin
    vidlora token create USER --name WHAT --scope read|review     prints the token once
    vidlora token list [USER] | revoke ID
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


def _accounts(change):
    """Run ``change(session)`` in one transaction; an account error is a clean CLI error."""
    from vidlora.db import session_scope
    from web.auth.tokens import TokenError
    from web.auth.users import UserError

    try:
        with session_scope() as session:
            return change(session)
    except (UserError, TokenError) as exc:
        raise click.ClickException(str(exc)) from exc


@user_group.command("create")
@click.argument("username")
@click.option("--role", type=click.Choice(["reviewer", "admin"]), default="reviewer", show_default=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def user_create(username: str, role: str, password_stdin: bool) -> None:
    """Create a user who can sign in to the web app."""
    from web.auth.users import create_user

    password = _read_password(password_stdin)
    _accounts(lambda s: create_user(s, username, password, role))
    click.echo(f"user {username} created ({role})")


@user_group.command("list")
def user_list() -> None:
    """Every account: name, role, state, live API tokens."""
    from sqlalchemy import func, select

    from vidlora.models import ApiToken
    from web.auth.users import list_users

    def rows(session):
        live = dict(session.execute(select(ApiToken.user_id, func.count()).where(ApiToken.revoked_at.is_(None))
                                    .group_by(ApiToken.user_id)).all())
        return [(u.username, u.role, "active" if u.is_active else "deactivated", live.get(u.id, 0))
                for u in list_users(session)]

    for name, role, state, tokens in _accounts(rows):
        click.echo(f"{name:<24} {role:<9} {state:<12} {tokens} live token{'s' if tokens != 1 else ''}")


@user_group.command("deactivate")
@click.argument("username")
def user_deactivate(username: str) -> None:
    """Sign a user out everywhere, revoke their API tokens, refuse further sign-ins."""
    from web.auth.users import set_active

    _accounts(lambda s: set_active(s, username, False))
    click.echo(f"user {username} deactivated")


@user_group.command("activate")
@click.argument("username")
def user_activate(username: str) -> None:
    """Let a deactivated user sign in again (their old API tokens stay revoked)."""
    from web.auth.users import set_active

    _accounts(lambda s: set_active(s, username, True))
    click.echo(f"user {username} activated")


@user_group.command("reset")
@click.argument("username")
def user_reset(username: str) -> None:
    """Give a user a new random password (printed once); their sessions and API tokens end."""
    from web.auth.users import reset_password

    click.echo(_accounts(lambda s: reset_password(s, username)))


@user_group.command("role")
@click.argument("username")
@click.argument("role", type=click.Choice(["reviewer", "admin"]))
def user_role(username: str, role: str) -> None:
    """Make a user a reviewer or an admin (admins manage accounts in the web app)."""
    from web.auth.users import set_role

    _accounts(lambda s: set_role(s, username, role))
    click.echo(f"user {username} is now {role}")


@user_group.command("set-password")
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
def user_set_password(username: str, password_stdin: bool) -> None:
    """Give an existing user a new password (their sessions and API tokens end)."""
    from vidlora.db import session_scope
    from web.auth.users import UserError, set_password

    password = _read_password(password_stdin)
    try:
        with session_scope() as session:
            revoked = set_password(session, username, password)
    except UserError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"password of {username} changed; signed out everywhere, {revoked} API token(s) revoked")


@click.group("token")
def token_group() -> None:
    """API tokens: what scripts send instead of a password (Authorization: Bearer TOKEN)."""


@token_group.command("create")
@click.argument("username")
@click.option("--name", required=True, help="What the token is for (shown in lists).")
@click.option("--scope", type=click.Choice(["read", "review"]), default="read", show_default=True,
              help="read: GET only; review: also submit batches and reviews.")
def token_create(username: str, name: str, scope: str) -> None:
    """Create a token for USER and print it (the only time it is shown)."""
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    click.echo(_accounts(lambda s: create_token(s, get_user(s, username), name, scope).token))


@token_group.command("list")
@click.argument("username", required=False)
def token_list(username: str | None) -> None:
    """Tokens (a user's, or everyone's): id, user, scope, name, state. Never the token itself."""
    from web.auth.tokens import user_tokens
    from web.auth.users import get_user

    def rows(session):
        owner = get_user(session, username).id if username else None
        return [(t.id, t.user.username, t.scope, t.name,
                 f"revoked {t.revoked_at:%Y-%m-%d}" if t.revoked_at else
                 (f"last used {t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never used"))
                for t in user_tokens(session, owner)]

    for token_id, user, scope, name, state in _accounts(rows):
        click.echo(f"{token_id:>5}  {user:<20} {scope:<7} {name:<30} {state}")


@token_group.command("revoke")
@click.argument("token_id", type=int)
def token_revoke(token_id: int) -> None:
    """Revoke a token: requests with it are refused from now on."""
    from web.auth.tokens import revoke_token

    _accounts(lambda s: revoke_token(s, token_id))
    click.echo(f"token {token_id} revoked")


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
        app = create_app(dev=dev, warm=dev)  # gunicorn: each worker warms after the fork (_serve_gunicorn)
    except InsecureSecretKey as exc:
        raise click.ClickException(str(exc)) from exc
    if dev:
        app.run(host=host, port=port, debug=False, threaded=True)
        return
    _serve_gunicorn(app, f"{host}:{port}", workers, threads, settings.cpu_time_limit_s)


def _serve_gunicorn(app, bind: str, workers: int, threads: int, timeout: int) -> None:
    from gunicorn.app.base import BaseApplication

    from web.scenarios.warm import warm_in_background

    class Server(BaseApplication):
        def load_config(self) -> None:
            # Long timeout: a large upload is one long request while it is copied into the store.
            # The app is built here, before the workers fork, so it warms nothing itself: each
            # worker warms its own Scenarios measures once forked.
            for key, value in {"bind": bind, "workers": workers, "threads": threads,
                               "worker_class": "gthread", "timeout": timeout, "accesslog": "-",
                               "post_fork": lambda server, worker: warm_in_background()}.items():
                self.cfg.set(key, value)

        def load(self):
            return app

    Server().run()
