# capgate's image: a normal (not editable) install of its wheel, with the tokenizer data the
# exact prompt counts need, the collected static files, and no source tree, tests or benchmarks.
# docs/operations.md, "The image".

# Build stage: the tokenizer data, converted from the npm package js-tiktoken and checked against
# tiktoken's pinned sha256 (scripts/tiktoken_data.py), then the wheel that carries it.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends npm && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python scripts/tiktoken_data.py build/tiktoken \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# Runtime stage: the wheel installed into the image's Python; the tokenizer files land in
# <prefix>/share/tiktoken and the templates in <prefix>/share/capgate, where settings look.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /srv/capgate
# The demo organization's declaration (`django-admin apply deploy/demo.yaml`).
COPY deploy/ deploy/
ENV DJANGO_SETTINGS_MODULE=config.settings.prod \
    PYTHONUNBUFFERED=1 \
    CAPGATE_STATIC_ROOT=/srv/capgate/static \
    CAPGATE_DATA_DIR=/var/lib/capgate
# Static files are part of the image, served by whitenoise (config/settings/prod.py). Production
# settings refuse to load without secrets, so collectstatic gets throwaway ones, kept nowhere.
RUN DJANGO_SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(50))')" \
    CAPGATE_SECRET_KEY="$(python -c 'import secrets; print(secrets.token_urlsafe(32))')" \
    django-admin collectstatic --noinput -v0 \
    && mkdir -p /var/lib/capgate
EXPOSE 8000
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
