"""The GPU worker: the Celery app, the batching loop, the executor and model handlers."""
