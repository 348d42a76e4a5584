"""Waiting for a job's result: one Redis listener per process wakes the requests that wait
(waiters, followers), pushed views spare a read, reads are batched, held polls are
counted, and ``Prefer: wait`` is parsed.
"""
