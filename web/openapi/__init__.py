"""The OpenAPI 3.0 document of the HTTP API (``GET /openapi.json``), built from the live
catalogue.
"""
