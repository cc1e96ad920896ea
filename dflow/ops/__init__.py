"""Operations, seeing what runs do: a run's step tree as text (``tree``: ``Run.tree()``,
``dflow inspect``, the console), JSON logs with each step's context (``logs``), Prometheus
metrics (``metrics``), OpenTelemetry traces (``otel``) and what the observability flags of
``dflow worker`` set up (``worker_flags``). The observers plug into the runtime through the
``dflow.observe`` seam and read the store, so they sit below the runtime, which imports only
the tree (for ``Run.tree()``). Public: what ``dflow.metrics`` and ``dflow.otel`` re-export.
"""
