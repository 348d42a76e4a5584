# Flower, carpool's Celery monitor: it imports the Celery app (worker.celery_app),
# which needs Celery but never torch, so it runs from a slim image of a few
# hundred MB instead of the multi-gigabyte worker image. Build from the
# repository root:
#   docker build -f ops/docker/flower.Dockerfile -t carpool-flower .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# .dockerignore lets in only pyproject.toml, the lock, README.md and the package folders.
COPY . .
# The flower extra: Celery and Flower, no torch.
RUN pip install --constraint requirements/constraints.txt '.[flower]' \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin carpool
USER 10001

EXPOSE 5555
# Equal to carpool/stack/commands.toml [flower]. Its login comes from FLOWER_BASIC_AUTH.
CMD ["celery", "-A", "worker.celery_app", "flower", "--port=5555"]
