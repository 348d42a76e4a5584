"""The Celery shell around the loop: the bootstep, remote control, the registry heartbeat."""
