"""The Server-Sent Events surface: ``GET /jobs/<id>/events`` and ``GET /events`` follow
jobs until they end.
"""
