"""Benchmarks of the reference and engines, in process and over HTTP; records land in ``benchmarks/``.

Imports ``s1omni.runtime`` and starts servers as processes; nothing imports it but the CLI.
"""
