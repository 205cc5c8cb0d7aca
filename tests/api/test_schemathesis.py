"""Property-based: every operation of the OpenAPI schema, fed generated input by schemathesis
(in-process, through the WSGI app), never answers 5xx. Bounded to a few examples per operation so
it runs in about a minute."""

from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from config.wsgi import application

from .conftest import Org


@pytest.fixture
def api_schema(db):
    from drf_spectacular.generators import SchemaGenerator

    spec = SchemaGenerator().get_schema(request=None, public=True)
    return schemathesis.from_dict(spec, app=application)


@pytest.fixture
def keep_db_connection():
    # The WSGI handler closes the database connection after each request (as Django's test
    # client avoids doing): that would close the test's transaction under it.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


schema = schemathesis.from_pytest_fixture("api_schema")


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_5xx(case, org_a: Org, org_b: Org, keep_db_connection):
    # given: acme's write token, so requests reach the views instead of stopping at 404
    if "org_slug" in (case.path_parameters or {}):
        case.path_parameters["org_slug"] = org_a.slug
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {org_a.token_write}"}
    # when
    response = case.call_wsgi()
    # then
    case.validate_response(response, checks=(not_a_server_error,))
