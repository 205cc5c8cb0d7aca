"""The route table (gateway/http/routes.py): every declared route is reachable, a path no route
holds is 404 in the OpenAI shape, a proxied path asked with another method is 405 in its own
endpoint's shape, and a registration that would give a request two handlers is refused."""

from __future__ import annotations

import re

import httpx
import pytest

from echo import jobs as echo_jobs
from gateway.http import routes
from gateway.http.routes import MethodNotAllowed, NoRoute, Route, RouteConflict, RouteTable
from gateway.upstream import proxy
from jobs import background
from jobs import http as job_http


def _concrete(route: Route) -> str:
    """A path the route's template matches: each parameter filled with a plain id."""
    return re.sub(r"\{[^}]+\}", "id_1", route.path)


async def _noop(req, match) -> None:
    return None


def test_every_route_resolves_to_itself():
    # given: the gateway's table as the running app has it (jobs registered at startup)
    table = routes.TABLE
    declared = {(r.method, r.path) for r in table.routes}
    assert {(r.method, r.path) for r in routes.ROUTES} <= declared
    assert {(r.method, r.path) for r in job_http.routes()} <= declared
    for route in table.routes:
        # when: a request of the route's method on a path its template matches
        found, match = table.resolve(route.method, _concrete(route))
        # then: it reaches that route, with the template's parameters as the match's groups
        assert found is route, (route.method, route.path, found.path)
        assert match.groups() == ("id_1",) * route.path.count("{")


def test_the_echo_provider_table_resolves_each_route():
    for route in echo_jobs.ROUTES.routes:
        found, _ = echo_jobs.ROUTES.resolve(route.method, _concrete(route))
        assert found is route
    with pytest.raises(NoRoute):
        echo_jobs.ROUTES.resolve("GET", "/v1/nothing")


def test_unknown_paths_and_methods():
    table = routes.TABLE
    with pytest.raises(NoRoute) as unknown:
        table.resolve("GET", "/v1/nothing/here")
    assert not isinstance(unknown.value, MethodNotAllowed)
    # another method on a job path is no route (404), on a proxied path 405 naming the method it takes
    with pytest.raises(NoRoute) as job_path:
        table.resolve("PUT", "/v1/files")
    assert not isinstance(job_path.value, MethodNotAllowed)
    with pytest.raises(MethodNotAllowed) as proxied:
        table.resolve("GET", "/v1/messages")
    assert proxied.value.route.method == "POST" and proxied.value.route.flavor == "anthropic"
    # an id outside its template's characters or length is no route
    with pytest.raises(NoRoute):
        table.resolve("GET", "/v1/responses/" + "a" * 201)
    with pytest.raises(NoRoute):
        table.resolve("GET", "/v1/files/a.b")


def test_registering_the_job_routes_twice_is_refused():
    # given: the table with the job routes already registered (JobsConfig.ready)
    before = routes.TABLE.routes
    # when / then: a second registration is refused and changes nothing
    with pytest.raises(RouteConflict):
        job_http.install()
    with pytest.raises(RouteConflict):
        routes.register(*job_http.routes())
    assert routes.TABLE.routes == before
    # and background responses keep their one owner
    with pytest.raises(RuntimeError):
        proxy.register_background(background.submit)


def test_conflicting_routes_are_refused_all_or_none():
    table: RouteTable = RouteTable([*routes.ROUTES, *job_http.routes()])
    count = len(table.routes)
    # a literal segment a parameter already holds: GET /v1/files/content is GET /v1/files/{file_id}
    with pytest.raises(RouteConflict):
        table.register(Route("GET", "/v1/files/content", _noop))
    # any method on a path whose route refuses the others
    with pytest.raises(RouteConflict):
        table.register(Route("GET", "/v1/chat/completions", _noop))
    # a conflict within one registration, and a good route beside a bad one: nothing is added
    with pytest.raises(RouteConflict):
        table.register(Route("GET", "/v1/a/{x}", _noop), Route("GET", "/v1/a/{y:segment}", _noop))
    with pytest.raises(RouteConflict):
        table.register(Route("GET", "/v1/fresh", _noop), Route("POST", "/v1/files", _noop))
    assert len(table.routes) == count
    # control: routes on paths nothing else holds are accepted and resolve
    table.register(Route("GET", "/v1/fresh", _noop), Route("PUT", "/v1/files/{file_id}", _noop))
    assert table.resolve("GET", "/v1/fresh")[0].path == "/v1/fresh"
    assert table.resolve("PUT", "/v1/files/f_1")[0].method == "PUT"
    assert len(table.routes) == count + 2


def test_a_malformed_template_is_refused():
    with pytest.raises(ValueError):
        Route("GET", "v1/no-slash", _noop)
    with pytest.raises(ValueError):
        Route("GET", "/v1/{half", _noop)
    with pytest.raises(KeyError):
        Route("GET", "/v1/{x:nosuchkind}", _noop)


def test_misses_answer_in_the_endpoints_shape(gateway):
    with httpx.Client(base_url=gateway.url, timeout=10) as http:
        # a path no route holds: 404 in OpenAI's shape
        missing = http.get("/v1/nothing/here")
        assert missing.status_code == 404
        assert missing.json() == {
            "error": {
                "message": "No route for GET /v1/nothing/here.",
                "type": "not_found_error",
                "code": "not_found",
                "param": None,
            }
        }
        # a job path asked with a method it does not take: also 404
        assert http.put("/v1/files").json()["error"]["code"] == "not_found"
        # a proxied path asked with another method: 405, in that endpoint's own shape
        chat = http.get("/v1/chat/completions")
        assert chat.status_code == 405
        assert chat.json()["error"]["code"] == "method_not_allowed"
        assert chat.json()["error"]["message"] == "Use POST."
        messages = http.get("/v1/messages")
        assert messages.status_code == 405
        assert messages.json() == {
            "type": "error",
            "error": {"type": "api_error", "message": "Use POST.", "code": "method_not_allowed"},
        }
        # a trailing slash reaches the same route
        assert http.get("/v1/chat/completions/").status_code == 405
