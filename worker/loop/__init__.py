"""The batching loop: peek, decide, claim, run, complete; leases kept beside it."""
