"""The API against its own OpenAPI document, fuzzed by schemathesis with all its checks
(issue 19): for every operation, requests the document allows and requests it forbids, sent
with an API token, must get no server error; allowed ones are accepted, forbidden ones
refused; every response matches the document (status code, content type, headers, body
schema). This is the contract scripts are written against.

The document is read from the running app (a batch's scenarios are an enum of those that
exist), so the operations are listed from the static document and each one is fuzzed with
hypothesis inside its test: schemathesis' fixture-based loading does not work with this pytest.
"""

from __future__ import annotations

import itertools

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from vidlora.db import session_scope
from web.api.openapi import openapi_document

PATHS = openapi_document()["paths"]


@schemathesis.serializer("application/offset+octet-stream")
def _octets(ctx, value) -> bytes:
    """A tus chunk (PATCH /uploads/{key}) is raw bytes."""
    return value if isinstance(value, bytes) else str(value).encode()

ALLOWED, FORBIDDEN = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
# A request with neither parameters nor a body cannot be malformed: it has no "forbidden" case.
CASES = [pytest.param(method.upper(), path, mode, id=f"{method.upper()} {path}-{'allowed' if mode == ALLOWED else 'forbidden'}")
         for path, ops in PATHS.items() for method, op in ops.items() for mode in (ALLOWED, FORBIDDEN)
         if mode == ALLOWED or {"parameters", "requestBody"} & set(op)]


@pytest.fixture(scope="module")
def token(database, reviewer, factory) -> str:
    from web.auth.tokens import create_token
    from web.auth.users import get_user

    factory.batch()  # something to read and review
    with session_scope() as session:
        return create_token(session, get_user(session, reviewer), "contract test", "review").token


@pytest.fixture(scope="module")
def api_schema(app, token):
    addresses = itertools.count(1)  # not random: hypothesis seeds random, every call got one address

    def from_many_addresses(environ, start_response):
        # The fuzzer sends hundreds of wrong Basic credentials (its invalid-auth check): from one
        # address the sign-in throttle would rightly answer 429 after a while. Each request
        # comes from an address of its own here, so every operation's own contract is what is
        # checked; the throttle has its tests (test_auth.py).
        n = next(addresses)
        environ["REMOTE_ADDR"] = f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
        return app(environ, start_response)

    return schemathesis.openapi.from_wsgi("/api/v1/openapi.json", from_many_addresses)


@pytest.mark.parametrize("method, path, mode", CASES)
def test_every_operation_keeps_its_contract(api_schema, token, method, path, mode):
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None, derandomize=True)
    def check(case):
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, excluded_checks=_beyond_the_document(case))

    check()


def _beyond_the_document(case) -> list:
    """Where acceptance depends on what the document cannot say, a valid-looking request may
    be refused (with a 400 that says why): uploaded bytes that are not a video, field
    conditions naming fields of the scenario's own schema, a date range that ends before it
    starts, an edit that must fit the result, gold for a result nobody has approved or edited, a
    review that must name the version it read (If-Match: the document cannot know the result's
    current ETag), a resumable upload's offset, name and first bytes (tus: the server's state)."""
    path, query, body = case.operation.path, case.query or {}, case.body
    start, end = query.get("date_from"), query.get("date_to")
    backwards = isinstance(start, str) and isinstance(end, str) and bool(start and end) and start > end
    if path.startswith("/uploads"):
        # tus answers a missing or wrong Tus-Resumable with 412, as its specification says (not
        # a status the fuzzer counts as a refusal); each refusal is checked in test_resumable.py.
        return [schemathesis.checks.positive_data_acceptance, schemathesis.checks.negative_data_rejection]
    if (path == "/batches" or (path.startswith("/results") and (query.get("where") or backwards))
            or (isinstance(body, dict) and body.get("action") == "edit")
            or (path.endswith("/gold") and isinstance(body, dict) and body.get("gold") is True)
            or path.endswith("/review") or path.endswith("/fields")):
        return [schemathesis.checks.positive_data_acceptance]
    return []
