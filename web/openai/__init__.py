"""The OpenAI-compatible surface (``/v1``): files, bulk batches and embeddings."""
