"""Guard points: the rules a module keeps that a removal test switches off, one at a time, to
show the invariant breaks without it.

A module declares its guards once, each with the one-line rule it enforces:

    GUARDS = Guards(
        count_reserved="an admission counts what other requests already hold on each window",
    )

and its code reads `GUARDS.count_reserved` (always True in production). A removal test switches
one off with `monkeypatch.setattr(module.GUARDS, "count_reserved", False)`, and shows the
invariant breaking; its control runs with the guard on. Nothing else changes a guard. A name
that is not declared is an AttributeError, read or set, so a test cannot switch off a guard
that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator


class Guards:
    """A module's guard points: each on (True) unless a removal test switches it off."""

    __slots__ = ("_rules", "_on")
    _rules: dict[str, str]
    _on: dict[str, bool]

    def __init__(self, **rules: str) -> None:
        for name, rule in rules.items():
            if not isinstance(rule, str) or not rule.strip():
                raise ValueError(f"guard {name!r} needs the rule it enforces")
        object.__setattr__(self, "_rules", dict(rules))
        object.__setattr__(self, "_on", dict.fromkeys(rules, True))

    def __getattr__(self, name: str) -> bool:
        on = object.__getattribute__(self, "_on")
        if name not in on:
            raise AttributeError(f"no guard named {name!r}")
        return on[name]

    def __setattr__(self, name: str, value: bool) -> None:
        if name not in self._on:
            raise AttributeError(f"no guard named {name!r}")
        self._on[name] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def rule(self, name: str) -> str:
        """The rule guard `name` enforces."""
        return self._rules[name]

    def __repr__(self) -> str:
        return f"Guards({', '.join(f'{n}={v!r}' for n, v in self._on.items())})"
