"""s1omni: compiled serving for System-1 decision models.

The package is laid out as the design's top-level folders, each mapped under this name by
``pyproject.toml``: ``s1omni.runtime`` (members, planning, runners, heads, answers),
``s1omni.export`` (export, build, validation), ``s1omni.server`` (the HTTP app),
``s1omni.bench`` (benchmarks), ``s1omni.cli`` (the ``s1omni`` command) and ``s1omni.calib``
(the validation cases, shipped as package data).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("s1omni")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
