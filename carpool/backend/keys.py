"""The Redis key schema. No other module formats a Redis key.

Keys are hash-tagged per model, so on Redis Cluster each model's keys live in one
slot (one shard) and models spread over the masters. A model's shard ``<s>`` is a
short digest of its name (``shard(model)``), and every job id starts with its
model's shard, so ``GET /result/<id>`` finds the job's shard from the id alone.
Each Lua script touches one shard's keys only. State that spans models (GPU
leases) has a tag of its own, ``{p}``.

    {p.s}:job:<id>            str   one job's record (carpool/backend/records.py): status, attempts,
                                    times, score (its place in its bin zset, kept so a lost
                                    job goes back there), then its input, result or error
    {p.s}:q:<model>:<bin>     zset  queued job ids of one bin, scored by urgency (µs;
                                    carpool/admission/urgency.py): most urgent first, FIFO on ties
    {p.s}:leases              zset  the shard's claims (lease tokens), scored by lease deadline
                                    (ms): one entry per claim, renewed once for all its jobs
    {p.s}:claim:<token>       hash  one claim's jobs: id -> "1" for each job it still holds,
                                    "t" -> claim time (ms), "w" -> worker; gone with its last job
    {p.s}:idem:<model>:<key>  str   "<job id> <input digest>" for idempotent submits
    {p.s}:wake:<model>        list  tokens that wake a blocked worker (capped)
    {p.s}:stats:<model>:<bin> hash  admitted (count, for the workers' arrival rate), drained,
                                    last_batch_ms, and the drain rate as rate_c (decayed
                                    count), rate_t, rate_t0 (for Retry-After), and the
                                    workers' busy speed as busy_c (decayed count), busy_ms
    {p.s}:mstats:<model>      hash  the same drain rate and busy time over all the model's
                                    bins (rate_c, rate_t, rate_t0, busy_c): the pace of
                                    the predicted wait (admit.lua); coming_n, coming_at:
                                    workers starting and when they serve (coming.lua);
                                    refused:<tier>: jobs admit.lua refused, by service
                                    tier, never reset (GET /models)
                                    unloaded, gen, config: the repository's desired state
                                    (model_state.lua; carpool/backend/repository.py)
    {p.s}:tenants:<model>:<bin> hash  API-key owner -> "decayed admissions, as of ms, weight,
                                    virtual clock (µs)": fair share and fair queueing
    {p.s}:bytes:<model>       hash  queued input bytes of the model ("queued" -> bytes): the
                                    byte budget (admit.lua; carpool/admission/budget.py)
    {p.s}:bytes:<model>:<own> hash  the same, per API key (owner digest) when keys are on
    {p.s}:usage:<model>:<hour> hash "<owner>:<j|d|q|r>" -> jobs, device µs, queue ms,
                                    refused in that hour (hours since the epoch; lib/usage.lua)
    {p.s}:rollout:<model>     hash  the model's rollout (its own name's shard): version,
                                    percent, shadow, shadow_percent, retire:<v> -> ms
                                    (carpool/backend/rollouts.py)
    {p.s}:shadow-pairs:<model> zset "<served id> <copy id>" of shadow copies waiting to be
                                    compared, scored by when copied (ms)
    {p.s}:shadow:<model>      hash  compared:<v>, agreed:<v>: the shadow comparisons
    {p.s}:dead                list  ids of jobs failed by the reaper (workers lost them too
                                    often), newest first, capped: poison inputs to inspect
    {p.s}:outbox              zset  webhook events to deliver (carpool/core/wire.py's
                                    OutboxEvent), scored by when each is due (ms); added
                                    by the script that changes the job's state
                                    (lua/lib/outbox.lua), leased and settled by the
                                    dispatcher (dispatcher/)
    {p.s}:hook-wake           list  tokens that wake a blocked dispatcher (capped)
    {p.s}:hook:<id>           hash  one job's webhook deliveries: event -> JSON state
                                    (state, attempts, last_status, last_error, ...)
    {p.s}:hook-dead           list  dead-lettered deliveries (JSON), newest first, capped
    {p}:done                  chan  pub/sub: ids of jobs that reached an end state, one
                                    message per batch, space-separated
    {p}:results               chan  pub/sub: the views of the jobs a batch wrote
                                    (carpool/backend/pushed.py)
    {p}:admitted              chan  pub/sub: ids of jobs just queued, one message per
                                    admit.lua call, space-separated (web/results/waiters.py)
    {p}:claimed               chan  pub/sub: "<ms> <id> <attempts> ..." of the jobs one
                                    claim leased (claim.lua; web/results/followers.py)
    {p}:gpu:<uuid>            str   the worker that holds this GPU; expires with its lease
    {p}:gpu-free              list  tokens that wake a worker waiting for a GPU (capped)
    {p}:workers               hash  worker name -> "<until_ms> <JSON>": the models it serves
                                    and those it refused, with the reason (heartbeat,
                                    carpool/backend/registry.py)
    {p}:file:<id>             hash  one file's metadata (its bytes live in the file store)
    {p}:files:<owner>         zset  an API key's file ids, scored by creation (µs)
    {p}:bulk:<id>             hash  one bulk batch's document (OpenAI's /v1/batches):
                                    status, counts, times, cursor, chunks written,
                                    input_lost_at once its input is gone
                                    (carpool/backend/bulkdb.py, feeder/intake.py)
    {p}:bulks:<owner>         zset  an API key's bulk batch ids, scored by creation (µs)
    {p}:bulks:active          set   bulk batches the feeder still works on
    {p}:bulk:<id>:jobs        hash  line index -> its admitted job ids (space-separated),
                                    until the line's result is stored
    {p}:bulk:<id>:stored      str   bitmap: bit i set once line i is in a stored chunk
    {p}:outbox, {p}:hook-wake, {p}:hook:<bulk id>, {p}:hook-dead
                                    the same webhook outbox for bulk batch events
                                    (batch.completed, ...): in the bulk batches' slot, so
                                    a bulk batch's end and its event are one MULTI
                                    (bulkdb.py); ``BULK_HOOK_TAG`` names it
"""

from dataclasses import dataclass
from typing import Final

from carpool.core.shards import shard, shard_of_job
from carpool.core.wire import Family

#: The outbox "tag" of bulk batch events: the hook keys of ``{p}`` itself, not of a shard
#: (a shard tag is never empty). The dispatcher scans it besides the shards'.
BULK_HOOK_TAG: Final = ""


def hook_tag(family: Family, subject_id: str) -> str:
    """Whose outbox an event is in: a bulk batch's in ``BULK_HOOK_TAG``'s, a job's in its
    shard's."""
    return BULK_HOOK_TAG if family is Family.BULK else shard_of_job(subject_id)


def family_of_tag(tag: str) -> Family:
    """Whose events an outbox holds: ``BULK_HOOK_TAG``'s are bulk batches', a shard's jobs'."""
    return Family.BULK if tag == BULK_HOOK_TAG else Family.JOB


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (a prefix may hold ``*`` or ``[``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


@dataclass(frozen=True)
class Keys:
    """Formats every key under one prefix; tests give each run its own prefix."""

    prefix: str = "carpool"

    def _tag(self, shard_tag: str) -> str:
        return "{" + f"{self.prefix}.{shard_tag}" + "}"

    @property
    def _global(self) -> str:
        return "{" + self.prefix + "}"

    def job(self, job_id: str) -> str:
        return f"{self.job_prefix(shard_of_job(job_id))}{job_id}"

    def job_prefix(self, shard_tag: str) -> str:
        """What `job(id)` puts before the ids of one shard; Lua scripts build job keys."""
        return f"{self._tag(shard_tag)}:job:"

    def bin(self, model: str, bin_name: str) -> str:
        return f"{self.bin_prefix(shard(model))}{model}:{bin_name}"

    def bin_prefix(self, shard_tag: str) -> str:
        """What `bin(model, bin)` puts before "<model>:<bin>"; cancel.lua uses it."""
        return f"{self._tag(shard_tag)}:q:"

    def leases(self, shard_tag: str) -> str:
        return f"{self._tag(shard_tag)}:leases"

    def claim(self, shard_tag: str, token: str) -> str:
        return f"{self.claim_prefix(shard_tag)}{token}"

    def claim_prefix(self, shard_tag: str) -> str:
        """What `claim(tag, token)` puts before the token; reap.lua builds claim keys."""
        return f"{self._tag(shard_tag)}:claim:"

    def idempotency(self, model: str, key_digest: str) -> str:
        return f"{self._tag(shard(model))}:idem:{model}:{key_digest}"

    def wake(self, model: str) -> str:
        return f"{self.wake_prefix(shard(model))}{model}"

    def wake_prefix(self, shard_tag: str) -> str:
        """What `wake(model)` puts before the model; reap.lua and release.lua use it."""
        return f"{self._tag(shard_tag)}:wake:"

    def dead(self, shard_tag: str) -> str:
        return f"{self._tag(shard_tag)}:dead"

    def _hook_tag(self, shard_tag: str) -> str:
        return self._global if shard_tag == BULK_HOOK_TAG else self._tag(shard_tag)

    def outbox(self, shard_tag: str) -> str:
        return f"{self._hook_tag(shard_tag)}:outbox"

    @property
    def outbox_pattern(self) -> str:
        """A SCAN pattern of every shard's outbox, catalogued or not."""
        return self._tag("*") + ":outbox"

    def tag_of_outbox(self, key: str) -> str:
        """The shard tag in an outbox key that ``outbox_pattern`` found."""
        return key[len(self._tag("")) - 1:-len("}:outbox")]

    def hook_wake(self, shard_tag: str) -> str:
        return f"{self._hook_tag(shard_tag)}:hook-wake"

    def hook_state(self, job_id: str, shard_tag: str | None = None) -> str:
        """A job's delivery states (a bulk batch's: ``shard_tag`` ``BULK_HOOK_TAG``)."""
        tag = shard_of_job(job_id) if shard_tag is None else shard_tag
        return f"{self.hook_state_prefix(tag)}{job_id}"

    def hook_state_prefix(self, shard_tag: str) -> str:
        """What `hook_state(id)` puts before the id; hook_take.lua builds the keys."""
        return f"{self._hook_tag(shard_tag)}:hook:"

    def hook_dead(self, shard_tag: str) -> str:
        return f"{self._hook_tag(shard_tag)}:hook-dead"

    def stats(self, model: str, bin_name: str) -> str:
        return f"{self._tag(shard(model))}:stats:{model}:{bin_name}"

    def model_stats(self, model: str) -> str:
        """The model's drain rate and busy time over all its bins (admit.lua's pace)."""
        return f"{self._tag(shard(model))}:mstats:{model}"

    def rollout(self, model: str) -> str:
        return f"{self._tag(shard(model))}:rollout:{model}"

    def shadow_pairs(self, model: str) -> str:
        return f"{self._tag(shard(model))}:shadow-pairs:{model}"

    def shadow_counts(self, model: str) -> str:
        return f"{self._tag(shard(model))}:shadow:{model}"

    def usage_prefix(self, model: str) -> str:
        """The model's hourly usage hashes are this and the hour (lua/lib/usage.lua)."""
        return f"{self._tag(shard(model))}:usage:{model}:"

    def usage(self, model: str, hour: int) -> str:
        return f"{self.usage_prefix(model)}{hour}"

    def tenants(self, model: str, bin_name: str) -> str:
        return f"{self._tag(shard(model))}:tenants:{model}:{bin_name}"

    def job_pattern(self, shard_tag: str) -> str:
        """A SCAN/KEYS glob for every job record of a shard (the audit reads them all)."""
        return _glob_escape(self.job_prefix(shard_tag)) + "*"

    def bin_pattern(self, shard_tag: str) -> str:
        """A SCAN/KEYS glob for every bin zset of a shard."""
        return _glob_escape(self.bin_prefix(shard_tag)) + "*"

    @property
    def any_bin_pattern(self) -> str:
        """A SCAN/KEYS glob for every bin zset of every shard."""
        return _glob_escape("{" + self.prefix + ".") + "*}:q:*"

    @property
    def patterns(self) -> tuple[str, str]:
        """SCAN globs that together match every key under this prefix (tests clean up)."""
        return (_glob_escape(self._global) + "*",
                _glob_escape("{" + self.prefix + ".") + "*")

    @property
    def done_channel(self) -> str:
        return f"{self._global}:done"

    @property
    def results_channel(self) -> str:
        """Pub/sub: the final views of the jobs a batch wrote, and deleted ids
        (carpool/backend/pushed.py)."""
        return f"{self._global}:results"

    @property
    def admitted_channel(self) -> str:
        return f"{self._global}:admitted"

    @property
    def claimed_channel(self) -> str:
        """Pub/sub: the jobs each claim leased, with its time (the streams' ``running``)."""
        return f"{self._global}:claimed"

    def queued_bytes(self, model: str) -> str:
        """The model's byte-budget hash; ``queued_bytes(model) + ":" + owner`` is a key's."""
        return f"{self.bytes_prefix(shard(model))}{model}"

    def bytes_prefix(self, shard_tag: str) -> str:
        """What `queued_bytes(model)` puts before the model; cancel.lua builds it."""
        return f"{self._tag(shard_tag)}:bytes:"

    def owner_queued_bytes(self, model: str, owner: str) -> str:
        return f"{self.queued_bytes(model)}:{owner}"

    def gpu(self, uuid: str) -> str:
        return f"{self._global}:gpu:{uuid}"

    @property
    def workers(self) -> str:
        return f"{self._global}:workers"

    @property
    def gpu_free(self) -> str:
        return f"{self._global}:gpu-free"

    def file(self, file_id: str) -> str:
        return f"{self._global}:file:{file_id}"

    def files(self, owner: str) -> str:
        return f"{self._global}:files:{owner or '-'}"

    def bulk(self, bulk_id: str) -> str:
        return f"{self._global}:bulk:{bulk_id}"

    def bulks(self, owner: str) -> str:
        return f"{self._global}:bulks:{owner or '-'}"

    @property
    def bulks_active(self) -> str:
        return f"{self._global}:bulks:active"

    def bulk_jobs(self, bulk_id: str) -> str:
        return f"{self.bulk(bulk_id)}:jobs"

    def bulk_stored(self, bulk_id: str) -> str:
        return f"{self.bulk(bulk_id)}:stored"
