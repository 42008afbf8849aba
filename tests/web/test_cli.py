from __future__ import annotations

import click
from click.testing import CliRunner
from werkzeug.security import check_password_hash

from vidlora.db import session_scope
from vidlora.models import User
from web.cli import user_group, web_command


def _hash(username: str) -> str:
    with session_scope() as session:
        return session.query(User.password_hash).filter(User.username == username).scalar()


def test_user_create_from_stdin(database):
    result = CliRunner().invoke(user_group, ["create", "maria", "--password-stdin"], input="a fine password\n")
    assert result.exit_code == 0, result.output
    assert check_password_hash(_hash("maria"), "a fine password")
    again = CliRunner().invoke(user_group, ["create", "maria", "--password-stdin"], input="another password\n")
    assert again.exit_code == 1 and "already exists" in again.output


def test_user_create_with_prompt(database):
    result = CliRunner().invoke(user_group, ["create", "yusuf"], input="secret words\nsecret words\n")
    assert result.exit_code == 0, result.output
    assert check_password_hash(_hash("yusuf"), "secret words")


def test_short_password_refused(database):
    result = CliRunner().invoke(user_group, ["create", "shorty", "--password-stdin"], input="short\n")
    assert result.exit_code == 1 and "at least 8" in result.output
    assert _hash("shorty") is None


def test_set_password(database):
    CliRunner().invoke(user_group, ["create", "li", "--password-stdin"], input="first password\n")
    result = CliRunner().invoke(user_group, ["set-password", "li", "--password-stdin"], input="second password\n")
    assert result.exit_code == 0 and check_password_hash(_hash("li"), "second password")
    missing = CliRunner().invoke(user_group, ["set-password", "nobody", "--password-stdin"], input="whatever123\n")
    assert missing.exit_code == 1 and "no user" in missing.output


def test_web_refuses_without_secret(database):
    result = CliRunner().invoke(web_command, [])
    assert result.exit_code == 1 and "VIDLORA_SECRET_KEY is empty" in result.output


def test_commands_register_on_a_group():
    group = click.Group("vidlora")
    group.add_command(user_group)
    group.add_command(web_command)
    assert set(group.commands) == {"user", "web"}
