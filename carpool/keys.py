"""The Redis key schema. No other module formats a Redis key.

Every key carries the same hash tag (``{prefix}``), so each Lua script touches
keys of one slot and the protocol also runs on Redis Cluster (all of carpool's
keys then live on one shard: Cluster buys availability here, not capacity).

    {p}:job:<id>            hash  one job: input, status, times, score (its place in its bin
                                  zset, kept so a lost job goes back there), result
    {p}:q:<model>:<bin>     zset  queued job ids of one bin, scored by urgency (µs;
                                  carpool/urgency.py): most urgent first, FIFO on ties
    {p}:leases              zset  claimed job ids, scored by lease deadline (ms)
    {p}:idem:<model>:<key>  str   "<job id> <input digest>" for idempotent submits
    {p}:wake:<model>        list  tokens that wake a blocked worker (capped)
    {p}:done                chan  pub/sub: the id of every job that reached an end state
    {p}:stats:<model>:<bin> hash  admitted (count, for the workers' arrival rate), drained,
                                  last_batch_ms, and the drain rate as rate_c (decayed
                                  count), rate_t, rate_t0 (for Retry-After)
    {p}:tenants:<model>:<bin> hash  API-key owner -> "decayed admissions, as of ms, weight,
                                  virtual clock (µs)": fair share and fair queueing
    {p}:gpu:<uuid>          str   the worker that holds this GPU; expires with its lease
    {p}:gpu-free            list  tokens that wake a worker waiting for a GPU (capped)
    {p}:dead                list  ids of jobs failed by the reaper (workers lost them too often),
                                  newest first, capped: a place to inspect poison inputs
"""

from dataclasses import dataclass


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (a prefix may hold ``*`` or ``[``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


@dataclass(frozen=True)
class Keys:
    """Formats every key under one prefix; tests give each run its own prefix."""

    prefix: str = "carpool"

    @property
    def _tag(self) -> str:
        return "{" + self.prefix + "}"

    def job(self, job_id: str) -> str:
        return f"{self._tag}:job:{job_id}"

    @property
    def job_prefix(self) -> str:
        """What `job(id)` puts before the id; Lua scripts build job keys from it."""
        return f"{self._tag}:job:"

    def bin(self, model: str, bin_name: str) -> str:
        return f"{self.bin_prefix}{model}:{bin_name}"

    @property
    def bin_prefix(self) -> str:
        """What `bin(model, bin)` puts before "<model>:<bin>"; cancel.lua uses it."""
        return f"{self._tag}:q:"

    @property
    def leases(self) -> str:
        return f"{self._tag}:leases"

    def idempotency(self, model: str, key_digest: str) -> str:
        return f"{self._tag}:idem:{model}:{key_digest}"

    def wake(self, model: str) -> str:
        return f"{self.wake_prefix}{model}"

    @property
    def wake_prefix(self) -> str:
        """What `wake(model)` puts before the model; reap.lua and release.lua use it."""
        return f"{self._tag}:wake:"

    @property
    def dead(self) -> str:
        return f"{self._tag}:dead"

    @property
    def job_pattern(self) -> str:
        """A SCAN/KEYS glob for every job hash (the audit reads them all)."""
        return _glob_escape(self.job_prefix) + "*"

    @property
    def bin_pattern(self) -> str:
        """A SCAN/KEYS glob for every bin zset."""
        return _glob_escape(self.bin_prefix) + "*"

    @property
    def done_channel(self) -> str:
        return f"{self._tag}:done"

    def stats(self, model: str, bin_name: str) -> str:
        return f"{self._tag}:stats:{model}:{bin_name}"

    def tenants(self, model: str, bin_name: str) -> str:
        return f"{self._tag}:tenants:{model}:{bin_name}"

    def gpu(self, uuid: str) -> str:
        return f"{self._tag}:gpu:{uuid}"

    @property
    def gpu_free(self) -> str:
        return f"{self._tag}:gpu-free"
