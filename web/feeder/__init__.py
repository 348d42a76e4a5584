"""The feeder: the process kind that runs bulk batches (``python -m web.feeder``).

It checks each batch's input file, feeds its lines into the model's bins at the
batch priority as the bins have room, appends each ended line to the file store,
and writes the output and error files (docs/batches.md). It lives in ``web/``
because a line is checked by the web's own input validation (carpool/intake/inputs.py), and
like the web it never imports torch or Celery.
"""
