"""A first distributed app: the flows of an order service (``flows``), run by ``dflow worker``
processes, and a client that starts an order, approves it and reads it back (``client``).
See the documentation's "Your first distributed app"."""
