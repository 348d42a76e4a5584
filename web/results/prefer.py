"""``Prefer: wait=N`` (RFC 7240), beside ``?wait=N``.

A client that cannot add a query parameter (a generic HTTP tool, a proxy's rewrite)
asks for a long-poll with the ``Prefer`` request header instead; the answer then
carries ``Preference-Applied: wait=N``, the wait honoured. Decisions:

- ``?wait=`` wins when both are given (it is explicit in the URL), and then no
  ``Preference-Applied`` is sent;
- ``wait`` is delta-seconds, a non-negative integer as RFC 7240 writes it; a value
  above ``CARPOOL_MAX_WAIT_S`` is capped to it (a preference is a hint, and the
  ``Preference-Applied`` header says what was applied), while a malformed one is a
  400 naming the header, as a malformed ``?wait=`` is;
- a preference given twice counts once, the first (RFC 7240, section 2); other
  preferences (``respond-async``, ``return``) are ignored, as the RFC asks.
"""

from __future__ import annotations

from carpool.core.errors import InvalidInput

#: The request header, and the answer's header that names what was applied.
PREFER = "Prefer"
PREFERENCE_APPLIED = "Preference-Applied"
#: The longest Prefer header read; a longer one is refused rather than parsed.
MAX_PREFER_CHARS = 1024


def preferred_wait_s(header: str | None, max_wait_s: float) -> float | None:
    """The wait that ``Prefer`` asks for (capped at ``max_wait_s``); None when it asks
    none. Raises ``InvalidInput`` for a malformed ``wait`` preference."""
    if not header:
        return None
    if len(header) > MAX_PREFER_CHARS:
        raise InvalidInput(f"the Prefer header is over {MAX_PREFER_CHARS} characters")
    for preference in header.split(","):
        token, _, rest = preference.partition(";")  # parameters after ";" are ignored
        name, eq, value = token.partition("=")
        if name.strip().lower() != "wait":
            continue
        value = value.strip().strip('"')
        if not eq or not (value.isascii() and value.isdigit()):
            raise InvalidInput(f"Prefer: wait must be whole seconds (e.g. 'Prefer: wait=10'), "
                               f"got {preference.strip()[:40]!r}")
        return min(float(value), max_wait_s) if len(value) <= 12 else max_wait_s
    return None


def applied(wait_s: float) -> dict[str, str]:
    """The ``Preference-Applied`` header for a wait that came from ``Prefer``."""
    return {PREFERENCE_APPLIED: f"wait={int(wait_s)}"}
