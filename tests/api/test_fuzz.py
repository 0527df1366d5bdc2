"""Property-based fuzzing of every operation in /api/openapi.json (schemathesis, in-process WSGI).

Bounded and deterministic: a fixed number of examples per operation, derandomized, no deadline.
Asserts no 5xx and that every response matches its documented schema.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from app.api import create_app
from app.auth import LocalScopeResolver
from app.orchestrator import Orchestrator
from tests.api.conftest import png_bytes, upload

FUZZ = hsettings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture()
def fuzz_app(settings, engine, publisher, store):
    return create_app(scope_resolver=LocalScopeResolver(), settings=settings, orchestrator=Orchestrator(engine, settings),
                      engine=engine, publisher=publisher, store=store)


def test_openapi_fuzz(fuzz_app):
    app, client = fuzz_app, fuzz_app.test_client()
    # Some real data, so that generated ids sometimes miss and list/search paths return items.
    assert upload(client, png_bytes()).status_code == 201
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 19
    failures = []
    for operation in operations:

        @FUZZ
        @given(case=operation.as_strategy())
        def run(case):
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        try:
            run()
        except Exception as exc:  # noqa: BLE001 - collect all operations' failures, then report them together
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
