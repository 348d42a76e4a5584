# The GPU worker: a solo-pool Celery worker with torch, one container per GPU.
# (Flower has a slim image of its own: ops/docker/flower.Dockerfile.) Build from the
# repository root:
#   docker build -f ops/docker/worker.Dockerfile -t carpool-worker .
#
# Why this base: the official PyTorch runtime image already holds torch built
# against its CUDA runtime and cuDNN, so the ~5 GB torch install is a base layer
# pulled once and shared by every rebuild, not a download on each build. Its
# torch version must equal the `torch==` pin of pyproject's worker extra
# (tests/deploy/test_deploy_compose.py checks the default tag); the constraint below then
# holds pip to the torch it finds, so a mismatch fails the build loudly instead of
# quietly downloading a second torch; every package is held to its version in
# requirements/constraints.txt, the lock every install path uses. torchvision, when the
# base lacks the pinned one, is a small download built for that same torch.
ARG TORCH_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime
FROM ${TORCH_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# .dockerignore lets in only pyproject.toml, the lock, README.md and the package folders.
COPY . .
RUN python -c "import importlib.metadata as md; print('torch==' + md.version('torch').split('+')[0])" \
        > /tmp/base-torch.txt \
 && pip install --constraint /tmp/base-torch.txt --constraint requirements/constraints.txt '.[worker]' \
 && useradd --uid 10001 --create-home --shell /usr/sbin/nologin carpool \
 && install -d -o carpool -g carpool /home/carpool/.cache /var/cache/carpool/profiles
USER 10001
# Model weights and hub caches land under ~/.cache, calibration profiles under
# /var/cache/carpool/profiles. Both folders exist in the image, owned by carpool,
# so a fresh named volume mounted on one (compose) copies that ownership instead
# of coming up root-owned and unwritable (/app, the working folder, is root's).
ENV HOME=/home/carpool \
    CARPOOL_PROFILE_DIR=/var/cache/carpool/profiles
# torchvision's pretrained weights for `weights = "torchvision"`, baked in at build
# time so the worker starts offline: a comma list of architectures, e.g.
#   docker build --build-arg CARPOOL_TORCHVISION_WEIGHTS=resnet18 ...
# They go to TORCH_HOME's cache, outside $HOME/.cache (compose mounts a volume there,
# which would hide them). Empty (the default): nothing is downloaded.
ARG CARPOOL_TORCHVISION_WEIGHTS=""
ENV TORCH_HOME=/home/carpool/torch
RUN for arch in $(echo "$CARPOOL_TORCHVISION_WEIGHTS" | tr ',' ' '); do \
      python -c "import sys, torchvision as tv; tv.models.get_model(sys.argv[1], weights=tv.models.get_model_weights(sys.argv[1]).DEFAULT)" "$arch" || exit 1; \
    done

# Worker metrics (CARPOOL_WORKER_METRICS_PORT).
EXPOSE 9100

# SIGTERM is Celery's warm shutdown: finish the batch in hand, hand unstarted
# leases back to their bins, exit. SIGQUIT would be a cold shutdown.
STOPSIGNAL SIGTERM
# Equal to carpool/stack/commands.toml [worker], which the end-to-end tests run.
# --pool solo: the batching loop owns the GPU in this one process; CUDA does not
# survive a fork, so no prefork children.
CMD ["celery", "-A", "worker.celery_app", "worker", "--pool", "solo", "--concurrency", "1", "-E", "-n", "worker@%h"]
