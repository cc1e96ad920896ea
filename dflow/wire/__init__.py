"""The wire: what crosses a process boundary as bytes or text, below everything that runs.

Values and step messages (``values``: msgpack data and registered pydantic models), run ids
(``ids``), the keys that sign stored flows and frames (``signing``), the objects that travel
by name instead of by value (``by_name``: those declared with ``dflow.shared`` and
pipelines), and the text of connection URLs (``urls``). Users reach what is public of it
through ``dflow.register_model`` and ``dflow.shared``; the adapters and the stores' contract
suites use the step messages of ``values`` and the URL helpers directly.
"""
