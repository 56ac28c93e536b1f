"""``python -m modelexport`` is the ``modelexport`` command."""

import sys

from .cli.app import main

sys.exit(main())
