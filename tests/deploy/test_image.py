"""The image's rules, read from the Dockerfile and .dockerignore (there is no Docker engine
here; tests/deploy/test_wheel.py builds and installs the wheel the image installs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.deploy import dockerfiles

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (ROOT / p).exists()]


def test_the_wheel_is_built_with_its_tokenizer_data_and_installed_normally():
    build, runtime = dockerfiles.stages(DOCKERFILE)
    # the build stage converts the tokenizer data into build/tiktoken, then builds the wheel,
    # which carries it (pyproject.toml's data-files)
    runs = build.all("RUN")
    tokenizers = next(i for i, r in enumerate(runs) if "scripts/tiktoken_data.py build/tiktoken" in r)
    wheel = next(i for i, r in enumerate(runs) if "pip wheel" in r and "--no-deps" in r)
    assert (tokenizers, runs[tokenizers].index("tiktoken_data.py")) < (wheel, runs[wheel].index("pip wheel"))
    assert '"share/tiktoken" = ["build/tiktoken/*"]' in (ROOT / "pyproject.toml").read_text()
    # the runtime stage installs that wheel, not the source tree, and never editable
    installs = [r for r in runtime.all("RUN") if "pip install" in r]
    assert installs and all("-e " not in r and "--editable" not in r for r in installs)
    assert any("/wheels/*.whl" in r for r in installs)
    copies = runtime.all("COPY")
    assert f"--from={build.name} /wheels /wheels" in copies
    assert all(c.startswith("--from=") or c.split()[0] == "deploy/" for c in copies), copies


def test_production_settings_static_files_and_the_entry_point():
    _build, runtime = dockerfiles.stages(DOCKERFILE)
    env = dockerfiles.env(runtime)
    assert env["DJANGO_SETTINGS_MODULE"] == "config.settings.prod"
    assert env["CAPGATE_STATIC_ROOT"] and env["CAPGATE_DATA_DIR"]
    collect = [r for r in runtime.all("RUN") if "collectstatic" in r]
    assert collect and "django-admin collectstatic --noinput" in collect[0]
    # throwaway secrets generated in the step, never a fixed value in the file
    assert "secrets.token_urlsafe" in collect[0] and "ARG" not in {kw for kw, _ in runtime.instructions}
    assert runtime.all("CMD") == ['["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]']


def test_the_build_context_leaves_out_tests_bench_docs_and_local_state():
    tracked = _tracked()
    kept = [p for p in tracked if not dockerfiles.ignored(DOCKERIGNORE, p)]
    left_out = {p.split("/")[0] for p in tracked if dockerfiles.ignored(DOCKERIGNORE, p)}
    assert {"tests", "bench", "docs"} <= left_out
    assert not [p for p in kept if p.startswith(("tests/", "bench/", "docs/", ".ci/"))]
    for path in (".venv/bin/python", ".env", "var/spool/x", "gateway/__pycache__/app.cpython-311.pyc", "build/lib/x"):
        assert dockerfiles.ignored(DOCKERIGNORE, path), path
    # what the build needs stays: every app's code, pyproject, templates, the tokenizer script
    for path in ("pyproject.toml", "gateway/http/app.py", "templates/registration/login.html", "deploy/demo.yaml"):
        assert path in kept, path
    assert "scripts/tiktoken_data.py" in kept
    assert not [p for p in kept if p.startswith("scripts/") and p != "scripts/tiktoken_data.py"]


def test_the_dockerignore_reading_follows_dockers_rules():
    # the reader itself: a pattern excludes what is under a matched directory, `*` stays in one
    # segment, `**` crosses them, the last matching line wins
    assert dockerfiles.ignored(DOCKERIGNORE, "tests/gateway/test_app.py")
    assert not dockerfiles.ignored(DOCKERIGNORE, "gateway/tests.py")
    assert dockerfiles.ignored(DOCKERIGNORE, "README.md") and not dockerfiles.ignored(DOCKERIGNORE, "deploy/x.md")
    assert dockerfiles.ignored(DOCKERIGNORE, "usage/sub/__pycache__/m.pyc")
    assert not dockerfiles.ignored(DOCKERIGNORE, ".env.example")
