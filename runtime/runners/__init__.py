"""Backbone runners: one protocol (``base``), three implementations (torch, ONNX Runtime, TensorRT)."""
