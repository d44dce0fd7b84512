"""Synthetic members: the released layout, tensor names and configs, with deterministic random weights."""
