"""The webhook dispatcher: a process kind of its own (``python -m dispatcher``).

It leases due events from every shard's outbox (carpool/backend/outbox.py), POSTs each
job's document to its webhook, signed the Standard Webhooks way, and settles each try:
delivered, retried later with backoff, or dead-lettered (docs/webhooks.md).
"""
