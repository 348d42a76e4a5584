"""Rollouts: ``PUT`` and ``DELETE /models/<m>/rollout`` (docs/deployments.md)."""
