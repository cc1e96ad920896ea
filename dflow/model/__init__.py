"""The flow model and its interpreter, at the bottom of what runs: nothing here imports the
runtime, the stores' implementations or the patterns.

``nodes`` holds what a flow is made of (``Node``, ``Chain``, ``Frame``); ``flow`` the
``DFlow`` users build, with its operators and entry points; ``direct_run`` the runs of flows
built at run time; ``pipeline`` the checked flows that start runs (``Pipeline``, ``Entry``); ``signature`` and ``calls`` how a step's function
is called; ``interpret`` what a step does to its run, as pure functions; ``registry`` the
pipelines of this process; ``fingerprint`` when two chains pickle alike; ``chains`` and
``frames`` how chains and a run's frames travel through the store, signed. ``running`` is the
port through which the entry points reach the runtime, which installs itself there. Users
import ``DFlow``, ``InitParam``, ``Pipeline`` and ``Entry`` from ``dflow`` (or ``dflow.flow``,
``dflow.client``); nothing else here is public.
"""
