"""The Redis protocol: keys, records, the Lua scripts and one typed method per script."""
