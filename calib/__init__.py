"""Validation and calibration cases per family (``<family>/cases.json``, ``gates.json``), shipped as package data.

``<family>/make_cases.py`` regenerates a family's cases; the records under ``<family>/reference/``
are the reference's own tensors and answers for the members the test suite uses.
"""

from pathlib import Path

CALIB = Path(__file__).resolve().parent
