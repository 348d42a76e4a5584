"""carpool: a durable, binned job queue for batched asynchronous model inference.

This package is the shared core: settings, the model catalogue and its bins, the
Redis queue protocol and the command line. It never imports torch or flask.
"""

__version__ = "0.1.0"
