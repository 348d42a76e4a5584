"""The local stack and the `carpool` command line: processes, ports, a private Redis."""
