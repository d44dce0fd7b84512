"""``python -m s1omni``: the ``s1omni`` command line."""

from s1omni.cli.main import entry

entry()
