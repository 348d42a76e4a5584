"""What the worker shows: Prometheus metrics, Flower events, calibration profiles."""
