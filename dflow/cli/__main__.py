"""``python -m dflow.cli``: the ``dflow`` command."""

import sys

from . import main

sys.exit(main())
