"""The job API: ``POST /submit``, ``POST /submit/batch``, ``GET /result/<id>``, ``DELETE
/result/<id>``.
"""
