"""A model's shard tag, which every one of its job ids carries in front.

The Redis key schema (carpool/backend/keys.py) hash-tags each model's keys with it, so
the web finds a job's shard from its id alone.
"""

import base64
import functools
import hashlib

#: Characters of a model's shard tag, and so of the front of each of its job ids:
#: 24 bits, so models of a catalogue almost never share a slot (sharing one is
#: harmless: their keys still differ).
SHARD_CHARS = 4


#: Model names whose tags are kept: every key of a job and every new job id needs its
#: model's tag, and a SHA-256 per key was a tenth of the admit call's CPU.
SHARD_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=SHARD_CACHE_SIZE)
def shard(model: str) -> str:
    """The shard tag of ``model``: the same in every process, whatever the catalogue."""
    digest = hashlib.sha256(model.encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()[:SHARD_CHARS]


def shard_of_job(job_id: str) -> str:
    """The shard tag of a job, which its id carries in front (carpool.core.jobs.new_job_id)."""
    return job_id[:SHARD_CHARS]
