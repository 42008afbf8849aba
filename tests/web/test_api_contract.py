"""The API against its own OpenAPI document, fuzzed by schemathesis (issue 19): for every
operation, generated valid and invalid requests, sent with an API token, must never get a
server error, requests the document forbids must be refused, and every response must match
the document (status code, content type, headers, body schema). This is the contract scripts
are written against.

Not checked: that every request the document allows is accepted. The document cannot say
which scenario names exist or which bytes are a video; the API refuses those with a 400 that
names the problem, as it should."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from vidlora.db import session_scope
from web import create_app

# Loaded when the module is collected (the document is static; the test environment is set by
# then): schemathesis' fixture-based loading does not work with this pytest.
schema = schemathesis.openapi.from_wsgi(
    "/api/v1/openapi.json", create_app({"TESTING": True, "SECRET_KEY": "contract-test-secret"}))


@pytest.fixture(scope="module")
def token(database, reviewer, factory) -> str:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    factory.batch()  # something to read and review
    with session_scope() as session:
        return create_token(session, get_user(session, reviewer), "contract test", "review").token


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_keeps_its_contract(case, token):
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"},
                           excluded_checks=[schemathesis.checks.positive_data_acceptance])
