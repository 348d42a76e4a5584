"""What every surface of the web shares: reading a body, the caller's key, the table of
refusals and the JSON errors they answer with, load shedding, the web's metrics.
"""
