"""Settings come only from the environment (and an optional .env file for development)."""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
_dotenv = BASE_DIR / ".env"
if _dotenv.exists():
    environ.Env.read_env(str(_dotenv))
