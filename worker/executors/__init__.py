"""The executor family: how a claimed batch becomes one Outcome per job.

- ``base``: what the batch loop asks of an executor (``BatchExecutor``) and the
  counters every executor keeps (``ExecutorStats``, exported to Prometheus).
- ``runner``: torch-free steps shared by every executor: preprocess each input,
  split a failing batch until its cause stands alone, one Outcome per job.
- ``pipelined``: ``PipelinedExecutor``, ``depth`` batches in flight on one compute
  thread; at depth 1 the loop waits for each batch (the synthetic model's worker).
- ``torch_executor``: ``TorchExecutor``, the same pipeline on a device: pinned
  buffers and streams (``staging``), rungs of ``ladder``, out-of-memory recovery.

Nothing here imports torch but ``torch_executor``, ``staging`` and ``ladder``'s users:
a worker that serves only the synthetic model never loads it.
"""
