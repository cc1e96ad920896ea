"""Production patterns built on the flow model and the seams: compensation (``saga``),
re-running a run from a step (``rerun``), finding and breaking runs that wait for each other
(``deadlock``), state shared by runs (``state``) and circuit breakers (``circuit``). They sit
above the model and the in-memory store and below the runtime, which they reach through the
model's port. Public: ``State`` and ``Version`` (``dflow.state``), ``Circuit`` and
``CircuitState`` (``dflow.circuit``), the deadlock detector's parts (``dflow.deadlock``), and
``DFlow.compensate`` and ``Run.rerun_from``; ``saga`` and ``rerun`` are the core's own.
"""
