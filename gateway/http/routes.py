"""The route table: every /v1 endpoint the gateway answers, declared once.

A route is a method, a path template and a handler (Starlette's `routes = [...]`). A template's
`{name}` is one path segment of an id (`[A-Za-z0-9_-]`, 1 to 200 characters); `{name:segment}` is
any one segment. `RouteTable.resolve` finds the one route a request goes to; a path no route of its
method holds is 404, or 405 when a route that refuses other methods holds it.

Apps above the gateway (jobs: files, batches, videos) add their endpoints with `register`, once,
from their AppConfig.ready. A route that another route already answers for (the same method on a
path both could match) is refused with `RouteConflict`, so no request can have two handlers and
the order of the table never decides anything.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.http import endpoints
from gateway.http.request import Request

H = TypeVar("H")
Handler = Callable[[Request, re.Match[str]], Awaitable[None]]

# What a `{name}` or `{name:kind}` segment may hold.
SEGMENT_PATTERNS = {
    "id": r"[A-Za-z0-9_\-]{1,200}",
    "token": r"[A-Za-z0-9_\-]+",
    "segment": r"[^/]+",
}
_PARAM = re.compile(r"^\{(\w+)(?::(\w+))?\}$")


class RouteConflict(ValueError):
    """A route registered where the table already answers the same method on the same paths."""


class NoRoute(LookupError):
    """No route of the request's method holds its path."""


class MethodNotAllowed(NoRoute):
    """The path belongs to a route of another method that refuses all others (405)."""

    def __init__(self, route: Route) -> None:
        super().__init__(f"{route.path} answers {route.method} only")
        self.route = route


@dataclass(frozen=True)
class Route(Generic[H]):
    """One endpoint: `method` on the paths `path` matches, answered by `handler`.

    The handler is given the request and the path's match (its groups are the template's
    parameters, in order). `flavor` is the endpoint's error shape ("openai" or "anthropic");
    with `others_refused`, another method on this path is 405 in that shape rather than 404."""

    method: str
    path: str
    handler: H
    flavor: str = "openai"
    others_refused: bool = False
    segments: tuple[str | re.Pattern[str], ...] = field(init=False, repr=False, compare=False)
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"a route's path starts with '/': {self.path!r}")
        segments: list[str | re.Pattern[str]] = []
        for part in self.path[1:].split("/"):
            param = _PARAM.match(part)
            if param is None:
                if "{" in part or "}" in part:
                    raise ValueError(f"unreadable path segment {part!r} in {self.path!r}")
                segments.append(part)
            else:
                segments.append(re.compile(SEGMENT_PATTERNS[param.group(2) or "id"]))
        regex = "/".join(_regex(s) for s in segments)
        object.__setattr__(self, "segments", tuple(segments))
        object.__setattr__(self, "pattern", re.compile(f"^/{regex}$"))

    def overlaps(self, other: Route) -> bool:
        """Whether some path matches both routes' templates: segment by segment, two literals
        are equal, a literal fits the other's parameter, and any two parameters overlap (every
        segment kind admits the same plain ids)."""
        if len(self.segments) != len(other.segments):
            return False
        for mine, theirs in zip(self.segments, other.segments, strict=True):
            if isinstance(mine, str) and isinstance(theirs, str):
                if mine != theirs:
                    return False
            elif isinstance(mine, str) and isinstance(theirs, re.Pattern):
                if theirs.fullmatch(mine) is None:
                    return False
            elif isinstance(mine, re.Pattern) and isinstance(theirs, str):
                if mine.fullmatch(theirs) is None:
                    return False
        return True

    def conflicts_with(self, other: Route) -> bool:
        """Two routes conflict when a request could go to either: the same method on
        overlapping paths, or overlapping paths where one refuses every other method."""
        same_method = self.method == other.method or self.others_refused or other.others_refused
        return same_method and self.overlaps(other)


def _regex(segment: str | re.Pattern[str]) -> str:
    return f"({segment.pattern})" if isinstance(segment, re.Pattern) else re.escape(segment)


class RouteTable(Generic[H]):
    """Routes of which no two conflict; `resolve` gives a request its one route."""

    def __init__(self, routes: Iterable[Route[H]] = ()) -> None:
        self._routes: list[Route[H]] = []
        self.register(*routes)

    @property
    def routes(self) -> tuple[Route[H], ...]:
        return tuple(self._routes)

    def register(self, *routes: Route[H]) -> None:
        """Add routes; all or none: any that conflicts with the table or with another of them
        (a second registration of the same routes included) raises RouteConflict."""
        for i, route in enumerate(routes):
            for other in [*self._routes, *routes[:i]]:
                if route.conflicts_with(other):
                    raise RouteConflict(
                        f"{route.method} {route.path} conflicts with {other.method} {other.path} "
                        f"({_name(other.handler)})"
                    )
        self._routes.extend(routes)

    def resolve(self, method: str, path: str) -> tuple[Route[H], re.Match[str]]:
        """The route for `method` on `path`, with the path's match. Raises MethodNotAllowed
        when the path is a route's that refuses other methods, else NoRoute."""
        refused: Route[H] | None = None
        for route in self._routes:
            matched = route.pattern.match(path)
            if matched is None:
                continue
            if route.method == method:
                return route, matched
            if route.others_refused:
                refused = route
        if refused is not None:
            raise MethodNotAllowed(refused)
        raise NoRoute(f"{method} {path}")


def _name(handler: object) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)


# The gateway's own endpoints. The proxied ones answer only POST: another method is 405 in the
# endpoint's own error shape (an Anthropic SDK cannot read OpenAI's).
ROUTES: list[Route[Handler]] = [
    Route("POST", "/v1/chat/completions", endpoints.proxied("chat"), others_refused=True),
    Route("POST", "/v1/messages", endpoints.proxied("messages"), flavor="anthropic", others_refused=True),
    Route("POST", "/v1/embeddings", endpoints.proxied("embeddings"), others_refused=True),
    Route("POST", "/v1/responses", endpoints.proxied("responses"), others_refused=True),
    # Not others_refused: another method reaches a stored response named "compact" (a 404).
    Route("POST", "/v1/responses/compact", endpoints.proxied("compact")),
    Route("POST", "/v1/messages/count_tokens", endpoints.count_tokens, flavor="anthropic"),
    Route("GET", "/v1/responses/{response_id}", endpoints.stored("get")),
    Route("DELETE", "/v1/responses/{response_id}", endpoints.stored("delete")),
    Route("POST", "/v1/responses/{response_id}/cancel", endpoints.stored("cancel")),
    Route("GET", "/v1/responses/{response_id}/input_items", endpoints.stored("input_items")),
    Route("GET", "/v1/models", endpoints.models),
    Route("POST", "/v1/reservations", endpoints.create_reservation),
    Route("POST", "/v1/reservations/{reservation_id:segment}/settle", endpoints.settle),
    Route("POST", "/v1/reservations/{reservation_id:segment}/release", endpoints.release),
]

TABLE: RouteTable[Handler] = RouteTable(ROUTES)


def register(*routes: Route[Handler]) -> None:
    """Add an app's endpoints to the gateway's table (once, from its AppConfig.ready): a route
    the table already answers for raises RouteConflict and nothing is added."""
    TABLE.register(*routes)


__all__ = ["Handler", "MethodNotAllowed", "NoRoute", "Route", "RouteConflict", "RouteTable", "TABLE", "register"]
