"""What a job brings in, checked before it is queued: a request's inputs, images, a user
model's JSON, an embeddings request, the lines of a bulk file. Shared by the web and the
feeder; imports no Flask.
"""
