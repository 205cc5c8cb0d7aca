"""Run under production settings (in a subprocess of tests/deploy/test_static_files.py): GET the
API docs page and the admin's login page, then every /static/ asset they link, and print what
answered as JSON. With --without-whitenoise the middleware is taken out first (the control)."""

from __future__ import annotations

import json
import re
import sys

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test import Client  # noqa: E402

if "--without-whitenoise" in sys.argv:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.startswith("whitenoise.")]

client = Client()
pages = {}
for page in ("/api/docs/", "/admin/login/"):
    response = client.get(page, secure=True)
    html = response.content.decode()
    assets = sorted(set(re.findall(r"""(?:src|href)=["'](/static/[^"']+)["']""", html)))
    answers = []
    for url in assets:
        asset = client.get(url, secure=True)
        body = b"".join(asset.streaming_content) if asset.streaming else asset.content
        answers.append(
            {"url": url, "status": asset.status_code, "type": asset.get("Content-Type", ""), "bytes": len(body)}
        )
    pages[page] = {"status": response.status_code, "assets": answers}
print(json.dumps(pages))
