"""The wheel the image installs (Dockerfile), built and installed here as a normal install in a
fresh environment outside the checkout: it imports, passes Django's checks, finds its templates
and its tokenizer data, and carries no tests or benchmarks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from gateway.admission import tokens

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from pathlib import Path
import django
django.setup()
from django.conf import settings
from django.template.loader import get_template
import catalog, gateway
from gateway.admission import tokens
print(json.dumps({
    "prefix": sys.prefix,
    "gateway": gateway.__file__,
    "tokenizer_dir": str(settings.CAPGATE["TOKENIZER_DIR"]),
    "loaded": {name: tokens.encoding(name) is not None for name in tokens.ENCODINGS},
    "template": get_template("registration/login.html").origin.name,
    "prices": (Path(catalog.__file__).parent / "data" / "prices.json").is_file(),
}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, an environment it is installed in), built from this checkout's files."""
    tmp = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    src = tmp / "src"
    for path in listed:
        if (ROOT / path).is_file():
            (src / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, src / path)
    # what `scripts/tiktoken_data.py build/tiktoken` leaves there (the Dockerfile's build step)
    shutil.copytree(settings.CAPGATE["TOKENIZER_DIR"], src / "build" / "tiktoken")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(src)], check=True, timeout=300)
    [wheel] = (tmp / "dist").glob("capgate-*.whl")
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    subprocess.run([*pip, "install", "--no-deps", "--prefix", str(env_dir), str(wheel)], check=True, timeout=300)
    return wheel, env_dir


def _env() -> dict[str, str]:
    # The dependencies come from this checkout's environment (its site-packages on the path,
    # where its editable capgate is not importable: .pth files are read only in site dirs);
    # capgate itself only from the installed wheel, run from a directory without the source.
    deps = sysconfig.get_paths()["purelib"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAPGATE_", "DJANGO_", "PYTHON"))}
    return env | {"PYTHONPATH": deps, "DJANGO_SETTINGS_MODULE": "config.settings.base"}


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env_dir / "bin" / "python"), *args], cwd=env_dir, env=_env(), capture_output=True, text=True, timeout=120
    )


def test_the_wheel_holds_every_app_module_and_no_tests_or_benchmarks(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    code = [
        p for p in tracked.stdout.split()
        if "/" in p and not p.startswith(("tests/", "bench/", "scripts/")) and (ROOT / p).exists()
    ]  # fmt: skip
    assert code and not [p for p in code if p not in names]
    assert not [n for n in names if n.startswith(("tests/", "bench/", "scripts/", "docs/"))]
    data = "capgate-0.1.0.data/data/share/"
    assert {f"{data}tiktoken/{tokens.cache_name(name)}" for name in tokens.ENCODINGS} <= names
    assert f"{data}capgate/templates/registration/login.html" in names
    assert "catalog/data/prices.json" in names


def test_the_installed_package_imports_checks_and_finds_its_data(built):
    _, env_dir = built
    # when
    check = _run(env_dir, "-m", "django", "check")
    probe = _run(env_dir, "-c", PROBE)
    # then
    assert check.returncode == 0, check.stderr
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert Path(seen["gateway"]).is_relative_to(env_dir), seen  # the install, not the checkout
    assert seen["tokenizer_dir"] == str(env_dir / "share" / "tiktoken")
    assert seen["loaded"] == {name: True for name in tokens.ENCODINGS}
    assert Path(seen["template"]).is_relative_to(env_dir / "share" / "capgate" / "templates")
    assert seen["prices"]


def test_the_installed_token_counter_serves_counts_from_the_installed_data(built):
    # given: the counter as the compose file runs it, from the install (its data by default)
    _, env_dir = built
    sock = Path(tempfile.mkdtemp(prefix="cg-wheel-", dir="/tmp")) / "counter.sock"
    server = subprocess.Popen(
        [str(env_dir / "bin" / "python"), "-m", "gateway.admission.token_counter", "serve", "--socket", str(sock)],
        cwd=env_dir,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while _run(env_dir, "-m", "gateway.admission.token_counter", "check", "--socket", str(sock)).returncode:
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read() if server.stderr else ""
            time.sleep(0.1)
        # when: a worker asks it for a count
        ask = f"print(token_counter.lengths({str(sock)!r}, 'o200k_base', ['hello world']))"
        asked = _run(env_dir, "-c", f"from gateway.admission import token_counter\n{ask}")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(sock.parent, ignore_errors=True)
    # then
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.strip() == "[2]"
    assert "loaded o200k_base" in (server.stderr.read() if server.stderr else "")
