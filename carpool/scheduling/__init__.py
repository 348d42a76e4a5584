"""Pure scheduling: the batch decision, cost models, rates, SLO caps. No Redis, no torch."""
