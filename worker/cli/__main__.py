"""``python -m worker.cli``: the ``scorer-worker`` command line."""

import sys

from worker.cli import main

sys.exit(main())
