"""Claude Code and Codex CLI run as a user runs them, non-interactively, against a live capgate.

The binaries are the pinned npm packages scripts/clients.sh installs into .clients/. Each run gets
a fresh HOME (no login, no settings, no history carried between tests), the clients' telemetry,
error reporting and update checks off, and every proxy variable pointed at a closed port on
127.0.0.1 with only 127.0.0.1 exempt: a request to anywhere but the local gateway fails instead
of leaving the machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".clients" / "node_modules" / ".bin"
TIMEOUT_S = 120


def binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: run `bash scripts/clients.sh` (scripts/bootstrap.sh does)")
    return str(path)


def _closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(home: Path) -> dict[str, str]:
    dead = f"http://127.0.0.1:{_closed_port()}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "HTTP_PROXY": dead,
        "HTTPS_PROXY": dead,
        "ALL_PROXY": dead,
        "NO_PROXY": "127.0.0.1",
    }
    env |= {k.lower(): v for k, v in env.items() if k.endswith("PROXY")}
    return env


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> dict:
        return json.loads(self.stdout)


def _run(argv: list[str], *, env: dict[str, str], cwd: Path) -> Run:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    return Run(done.returncode, done.stdout, done.stderr)


def claude_env(home: Path, *, base_url: str, key: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    env = _base_env(home)
    env |= {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        # Claude Code's documented switches: no telemetry, no error reports, no auto-update, and
        # none of the nonessential traffic (release notes, feedback, model lists) besides.
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in headers.items())
    return env


def claude(
    home: Path, prompt: str, *, base_url: str, key: str, model: str, permission_mode: str | None = None, **kw
) -> Run:
    """`claude -p PROMPT --output-format json` in an empty working directory under HOME
    (with `--permission-mode` when given: "auto" is auto mode)."""
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    argv = [binary("claude"), "-p", prompt, "--output-format", "json", "--model", model]
    if permission_mode is not None:
        argv += ["--permission-mode", permission_mode]
    return _run(argv, env=claude_env(home, base_url=base_url, key=key, **kw), cwd=work)


CODEX_CONFIG = """\
model = "{model}"
model_provider = "capgate"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[model_providers.capgate]
name = "capgate"
base_url = "{base_url}/v1"
env_key = "CAPGATE_API_KEY"
wire_api = "responses"
{retries}{headers}"""

# Codex reconnects a streamed turn on any status it does not know, 402 included (five times by
# default); capgate answers its refusals in the stream instead (gateway/http/errors.py), so the
# README's block leaves Codex's retry settings as they are.
NO_STREAM_RETRIES = "stream_max_retries = 0\n"


def codex_config(
    *, base_url: str, model: str, env_headers: dict[str, str] | None = None, stream_retries: bool = True
) -> str:
    """The README's provider block for capgate; `env_headers`: header -> the variable it is read from;
    `stream_retries=False` adds `stream_max_retries = 0` (Codex's default is five reconnects)."""
    extra = ""
    if env_headers:
        extra = "env_http_headers = { " + ", ".join(f'"{k}" = "{v}"' for k, v in env_headers.items()) + " }\n"
    retries = "" if stream_retries else NO_STREAM_RETRIES
    return CODEX_CONFIG.format(model=model, base_url=base_url, headers=extra, retries=retries)


def codex(
    home: Path, prompt: str, *, base_url: str, key: str, model: str, env: dict[str, str] | None = None, **kw
) -> Run:
    """`codex exec --json PROMPT` with capgate as its model provider (~/.codex/config.toml)."""
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    (home / ".codex" / "config.toml").write_text(codex_config(base_url=base_url, model=model, **kw))
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    env = _base_env(home) | {"CAPGATE_API_KEY": key} | (env or {})
    argv = [binary("codex"), "exec", "--skip-git-repo-check", "--json", prompt]
    return _run(argv, env=env, cwd=work)
