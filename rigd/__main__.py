"""``python -m rigd``: the ``rigd`` command (rigd/client/cli.py)."""

import sys

from rigd.client.cli import main

sys.exit(main())
