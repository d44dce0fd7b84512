"""``python -m s1omni``: the ``s1omni`` command line."""

import sys

from s1omni.cli.main import main

sys.exit(main())
