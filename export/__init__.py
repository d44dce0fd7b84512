"""The offline stages: ONNX export of member backbones, engine builds and their validation.

``s1omni.export.onnx_export.export_backbone`` traces a package's Qwen3.5 text backbone into graphs
with explicit state (``prefill.onnx``, ``continue.onnx`` and, for Vela 2.0, ``packed.onnx``); ``s1omni.export.patches`` holds the
export-friendly forward it traces. Vision members add ``s1omni.export.vision_export`` (the tower) and
``s1omni.export.omnijev_export`` (what their export holds). This package imports ``runtime``; ``runtime``
never imports it.
"""
