"""The one error hierarchy of carpool; the web layer maps each class to a status."""

import math


class CarpoolError(Exception):
    """Raised for any failure that carpool itself detects."""


class ConfigError(CarpoolError):
    """Raised when settings or the catalogue are malformed or contradict each other."""


class BackendUnavailable(CarpoolError):
    """Raised when Redis cannot be reached, is loading, or refuses writes (out of memory)."""


class NotSent(BackendUnavailable):
    """Redis was lost before this job's admission was sent: it is surely not queued."""


class InvalidInput(CarpoolError):
    """Raised when a job's input fails validation before it is queued."""


class InputTooLarge(InvalidInput):
    """Raised when an input is over a byte, pixel or length limit."""


class UnsupportedMediaType(InvalidInput):
    """Raised when a request's Content-Type is not one that its model takes."""


class InvalidJson(InvalidInput):
    """Raised when a request body is not valid JSON."""


class TooManyInputs(InputTooLarge):
    """Raised when a batch submission holds more inputs than one request may."""


class TooManyJsonValues(InputTooLarge):
    """Raised when a JSON body holds more values than any input needs."""


class InputOverLimit(InvalidInput):
    """Raised when an input nests deeper, or one of its arrays or objects holds more
    items, than the input limits allow (carpool/core/input_limits.py)."""


class UnknownModel(CarpoolError):
    """Raised when a request names a model that is not in the catalogue."""


class ModelRefused(CarpoolError):
    """Raised when every live worker that tried to load a model refused it (with why)."""


class ModelUnloaded(ModelRefused):
    """Raised when a job names a model that was unloaded (the repository API)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} was unloaded (POST /v2/repository/models/{model}"
                         "/unload): it takes no jobs until it is loaded again")
        self.model = model


class BinFull(CarpoolError):
    """Raised when a bin is at its depth bound; the client should retry later."""

    def __init__(self, model: str, bin_name: str, depth: int, retry_after_s: float,
                 message: str = "") -> None:
        super().__init__(
            message or f"bin {bin_name!r} of model {model!r} is full ({depth} jobs waiting); "
            f"retry after {retry_after_s:.0f} s"
        )
        self.model = model
        self.bin_name = bin_name
        self.depth = depth
        self.retry_after_s = retry_after_s


class WaitTooLong(BinFull):
    """Raised when a job would start after its deadline (or max_queue_ms): refused now."""

    def __init__(self, model: str, bin_name: str, ahead: int, predicted_ms: float,
                 limit_ms: int, retry_after_s: float) -> None:
        super().__init__(
            model, bin_name, ahead, retry_after_s,
            f"model {model!r} bin {bin_name!r}: the work ahead ({ahead} average jobs, its own "
            f"batch too when it has a deadline) would take "
            f"about {predicted_ms / 1000:.1f} s, later than its {limit_ms / 1000:g} s limit "
            f"(deadline_ms, else max_queue_ms); retry after {retry_after_s:.0f} s",
        )
        self.predicted_ms = predicted_ms
        self.limit_ms = limit_ms


class OverShare(BinFull):
    """Raised when a bin is near its bound and this API key is over its share of it."""

    def __init__(self, model: str, bin_name: str, depth: int, retry_after_s: float) -> None:
        super().__init__(
            model, bin_name, depth, retry_after_s,
            f"bin {bin_name!r} of model {model!r} is nearly full ({depth} jobs waiting) and "
            f"this API key has sent more than its share of them; retry after "
            f"{retry_after_s:.0f} s",
        )


class QuotaExceeded(BinFull):
    """Raised when this API key's quota (the keys file) for a model is spent."""

    def __init__(self, model: str, bin_name: str, kind: str, used: float, limit: float,
                 retry_after_s: float) -> None:
        what = (f"this API key used {used / 1000:.1f} s of its {limit / 1000:g} device seconds "
                f"this hour on model {model!r} (quota_device_s_per_hour)" if kind == "device"
                else f"this API key sends more than its {limit:g} jobs/s to model {model!r} "
                     "(quota_jobs_per_s)")
        super().__init__(model, bin_name, 0, retry_after_s,
                         f"{what}; retry after {math.ceil(retry_after_s)} s")
        self.kind = kind


class BudgetFull(CarpoolError):
    """Raised when a model's (or an API key's) queued input bytes are at their budget."""

    #: Retry-After of a spent byte budget: it frees as workers claim, seconds apart.
    RETRY_AFTER_S = 5.0

    def __init__(self, model: str, scope: str, held_bytes: int, budget_bytes: int) -> None:
        whose, setting = ((f"model {model!r}", "max_queued_bytes") if scope == "model" else
                          (f"this API key's jobs of {model!r}", "max_queued_bytes_per_key"))
        super().__init__(
            f"{whose} already hold {held_bytes} bytes of queued input, and this input would "
            f"pass the budget of {budget_bytes} ({setting}); retry after "
            f"{self.RETRY_AFTER_S:.0f} s, when workers have taken some"
        )
        self.model = model
        self.scope = scope
        self.retry_after_s = self.RETRY_AFTER_S


class IdempotencyConflict(CarpoolError):
    """Raised when an idempotency key is reused with a different input."""


class NotCancellable(CarpoolError):
    """Raised when a job is running and can no longer be cancelled."""


class BatchEnded(NotCancellable):
    """Raised when a bulk batch to cancel has already ended: no retry can change that."""


class HandlerContractError(CarpoolError):
    """Raised when a model handler returns the wrong number of results for a batch."""


class MissingExtra(CarpoolError):
    """Raised when a command needs a package of an optional extra that is not installed."""


class DeviceLost(CarpoolError):
    """Raised when a sticky CUDA error (a device-side assert, an illegal address) has
    corrupted the process's CUDA context: every later call fails, so the worker exits.
    Also what a worker exits with when a forward pass hangs past CARPOOL_MAX_BATCH_MS."""
