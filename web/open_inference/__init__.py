"""The Open Inference Protocol (KServe v2, ``/v2``): tensors in, one job per row, tensors
out.
"""
