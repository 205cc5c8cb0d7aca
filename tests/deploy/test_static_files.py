"""Under production settings the API docs page (Swagger UI) and the Django admin get their
/static/ assets: collected by `collectstatic`, served by whitenoise with their content types.
Without the middleware the same assets answer 404 (the control)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPES = {".css": "text/css", ".js": "text/javascript", ".png": "image/png", ".svg": "image/svg+xml"}


@pytest.fixture(scope="module")
def prod_env(tmp_path_factory) -> dict[str, str]:
    static_root = tmp_path_factory.mktemp("static")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.prod",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "CAPGATE_SECRET_KEY": secrets.token_urlsafe(32),
        "DJANGO_ALLOWED_HOSTS": "testserver",
        "CAPGATE_STATIC_ROOT": str(static_root),
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True, timeout=240
    )
    return env


def _probe(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.deploy.static_probe", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_docs_and_admin_assets_answer_200_with_their_content_type(prod_env):
    # when
    pages = _probe(prod_env)
    # then: both pages render, and every asset they link is served, hashed, with its type
    for page, seen in pages.items():
        assert seen["status"] == 200, page
        assert seen["assets"], f"{page} links no /static/ asset"
        for asset in seen["assets"]:
            assert asset["status"] == 200, asset
            assert asset["bytes"] > 0, asset
            suffix = Path(asset["url"]).suffix
            assert asset["type"].split(";")[0] == TYPES[suffix], asset
    docs = [a["url"] for a in pages["/api/docs/"]["assets"]]
    assert any("swagger-ui-bundle" in url and url.endswith(".js") for url in docs), docs
    assert any("swagger-ui" in url and url.endswith(".css") for url in docs), docs
    admin = [a["url"] for a in pages["/admin/login/"]["assets"]]
    assert any(url.startswith("/static/admin/css/") for url in admin), admin
    # names carry the content's hash (the manifest storage), so they can be cached for a year
    assert all(len(Path(url).suffixes) >= 2 for url in docs + admin), docs + admin


def test_without_whitenoise_the_same_assets_answer_404(prod_env):
    pages = _probe(prod_env, "--without-whitenoise")
    statuses = {a["status"] for seen in pages.values() for a in seen["assets"]}
    assert statuses == {404}
