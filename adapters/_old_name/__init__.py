"""``adapters``: the old import name of ``dflow.adapters``, deprecated in dflow-runtime 0.2 and
removed in 0.3. Installed as the top-level package ``adapters``; importing it warns, then
``adapters`` and each ``adapters.x`` are the very modules ``dflow.adapters`` and
``dflow.adapters.x`` (see ``dflow.adapters._alias``)."""

from dflow.adapters._alias import alias_old_name

alias_old_name()
