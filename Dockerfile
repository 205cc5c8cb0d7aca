FROM python:3.11-slim
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml ./
RUN pip install --no-cache-dir --upgrade pip
COPY . .
RUN pip install --no-cache-dir -e .
ENV DJANGO_SETTINGS_MODULE=config.settings.prod PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
