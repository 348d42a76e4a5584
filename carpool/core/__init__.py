"""Shared types: jobs, the catalogue, settings, errors, tokens. Imports nothing else of carpool."""
