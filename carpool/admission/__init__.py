"""Admission arithmetic: the arguments and replies of admit.lua, budgets, Retry-After."""
