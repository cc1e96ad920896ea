"""``python -m examples.assistant``: the local, offline demo (see ``run_local``)."""

from .run_local import main

raise SystemExit(main())
