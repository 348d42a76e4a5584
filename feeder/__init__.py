"""The feeder: the process kind that runs bulk batches (``python -m feeder``).

It checks each bulk batch's input file, feeds its lines into the model's bins at the
bulk priority as the bins have room, appends each ended line to the file store,
and writes the output and error files (docs/batches.md). A line is checked by the
same validation as a request to the web (carpool/intake/), and the feeder imports
neither Flask, nor torch, nor Celery: it runs from the web's image.
"""
