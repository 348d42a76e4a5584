# The web tier: Flask under gunicorn, and no torch, so a replica installs small
# and starts in well under a second. Build from the repository root:
#   docker build -f ops/docker/web.Dockerfile -t carpool-web .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# .dockerignore lets in only pyproject.toml, the lock, README.md and the package folders.
COPY . .
# The base install and boto3 (the s3 extra: batch files in object storage, for the
# web and the feeder, which share this image); the worker extra would bring torch
# (gigabytes) into an image that never imports it. The lock, as a constraint, pins
# every version and installs only what these extras need. The fixed uid lets
# Kubernetes' runAsNonRoot verify the user without reading /etc/passwd.
RUN pip install --constraint requirements/constraints.txt '.[s3]' \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin carpool
USER 10001

# In a container the web must listen beyond loopback; outside one it defaults
# to 127.0.0.1:8000.
ENV CARPOOL_WEB_BIND=0.0.0.0:8000
EXPOSE 8000

# SIGTERM is gunicorn's graceful stop: it stops accepting, lets requests in
# flight (long-polls included) finish within graceful_timeout, then exits.
STOPSIGNAL SIGTERM
# Equal to carpool/stack/commands.toml [web], which the end-to-end tests run.
CMD ["gunicorn", "-c", "python:web.gunicorn_conf", "web:create_app()"]
