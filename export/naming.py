"""The names of an export's graph files, the layout of its weights files and the operator domain of the
ONNX Runtime contrib ops its graphs and builds write, apart from the exporter: ``s1omni build`` reads
exports by these without importing torch or transformers (a build's startup would otherwise spend
seconds on them)."""

from __future__ import annotations

# The backbone graphs of an export: every member's prefill and continue, and a Vela member's packed blocks
# (the shared_context profile's; ``s1omni.export.patches.PackedForward``).
GRAPHS = ("prefill", "continue", "packed")
RECURRENCES = ("scan", "fused")  # the portable ONNX Scan, or ONNX Runtime's fused kernel
ALIGNMENT = 65536  # large tensors start at offsets ONNX Runtime can memory-map on any page size
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops (LinearAttention, GatedDeltaNet, GemmFloat8, ...)
OP_DOMAIN = "ai.s1omni"  # this project's custom ops (s1omni.export.gdn_library)
OP_TYPE = "ChunkedGatedDeltaRule"


def graph_file(graph: str, recurrence: str) -> str:
    """``prefill.onnx`` (portable ``Scan``), ``prefill.fused.onnx`` (ONNX Runtime's fused kernels), ..."""
    return f"{graph}.onnx" if recurrence == "scan" else f"{graph}.{recurrence}.onnx"
