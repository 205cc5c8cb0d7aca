"""Just enough of Docker's file formats to check the image's rules without a Docker engine: a
Dockerfile's stages and instructions, and which paths a .dockerignore keeps out of the build
context (Docker's rules: patterns relative to the context root, `*` within one path segment,
`**` across segments, a pattern also excluding everything under a directory it matches, the
last matching line winning, `!` re-including)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages(path: Path) -> list[Stage]:
    text = re.sub(r"\\\n", " ", path.read_text())  # line continuations
    result: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), " ".join(args.split())
        if keyword == "FROM":
            words = args.split()
            result.append(Stage(base=words[0], name=words[2] if len(words) >= 3 and words[1].upper() == "AS" else None))
        else:
            result[-1].instructions.append((keyword, args))
    return result


def env(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            values[key] = value
    return values


def _regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "(?:/.*)?")  # a matched directory excludes what is under it


def ignored(dockerignore: Path, path: str) -> bool:
    """Whether `path` (relative to the context root) stays out of the build context."""
    verdict = False
    for raw in dockerignore.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        if _regex(pattern.strip("/")).fullmatch(path):
            verdict = not negate
    return verdict
