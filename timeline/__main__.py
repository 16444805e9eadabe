"""``python -m timeline``: the ``timeline`` command line (``timeline.cli``)."""

import sys

from timeline.cli import main

sys.exit(main())
