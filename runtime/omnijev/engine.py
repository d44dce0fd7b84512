"""OmniJev from an engine directory: the vision graph in ONNX Runtime, the backbone runner, the model.

An OmniJev engine holds what ``s1omni export`` wrote for it (``s1omni.export.omnijev_export``): the
backbone graphs, ``vision.onnx``, the tied embedding, heads, tokenizer, config, processor config,
calibration and the release fields. ``load_engine`` builds the same ``OmniJevModel`` a package
gives, with the engine's vision session and runner in place of the torch reference's.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from ..engine import engine_runner
from ..identity import Identity
from ..runners.capture_lock import device_run
from ..runners.cuda_graphs import UNCAPTURED, GraphedSession, capture_options, run_options
from ..runners.onnxruntime_runner import device_of, providers
from .heads import Heads
from .image import Pixels, Processor
from .model import PROCESSOR_CONFIG, OmniJevModel, Release
from .vision import grid_inputs
from .vocabulary import EngineLogProbs

VISION_GRAPH = "vision.onnx"
EMBEDDING = "embedding.safetensors"  # the tied embedding [vocabulary, hidden], float32
EMBEDDING_TENSOR = "embedding"
RELEASE = "release.json"  # the release manifest's fields the model reads (model_id, option_tokens, max_pixels)
# Image grids whose tower inputs a session keeps: a deployment sees few image sizes (a screen's, a camera's).
GRID_CACHE_SIZE = 32


class VisionSession:
    """``vision.onnx`` as a vision tower: the grid-derived inputs computed here, the tower in the graph.

    The grid-derived inputs depend on the image's grid alone, so each grid's are computed once and kept
    (read-only, ``GRID_CACHE_SIZE`` grids). transformers' helpers take 0.6 ms for a screenshot's 36x64 grid on a
    2-core host, but the H200's profile of a screenshot request put 8.6 ms of its forward in their two
    ``torch.floor`` calls (``benchmarks/README.md``, "OmniJev-4B at 1, 12 and 255 options").

    With ``cuda_graphs`` (an engine built with ``--vision-cuda-graphs``) the tower replays a CUDA graph per
    input shape, that is per patch count (``s1omni.runtime.runners.cuda_graphs``): the same profile launched
    1,135 kernels an iteration one by one, most of them the tower's, which runs eagerly because its shapes
    follow the image. Patches are not padded to buckets (padding would change the tower's attention), so each
    new patch count costs three runs of the tower once; past the module's limits a call runs eagerly. On the
    CPU the same fixed-buffer runs happen with nothing to capture.
    """

    def __init__(self, path: Path, config: dict[str, Any], device: str = "cpu", provider_options: dict[str, Any] | None = None,
                 cuda_graphs: bool = False):  # fmt: skip
        """``provider_options``: the engine manifest's, so the tower runs at the backbone's precision."""
        kind, device_id = device_of(device)
        options = {**(provider_options or {}), **capture_options(cuda_graphs, kind)}
        self.session = onnxruntime.InferenceSession(str(path), providers=providers(kind, device_id, options))
        self.config = config
        self.grid_feeds = functools.lru_cache(maxsize=GRID_CACHE_SIZE)(self._grid_feeds)
        self.graphs = GraphedSession(self.session, kind, device_id) if cuda_graphs else None
        # A graph-enabled session's runs outside every graph say so (``s1omni.runtime.runners.cuda_graphs``).
        self._uncaptured = run_options(UNCAPTURED) if cuda_graphs else None
        self._output = self.session.get_outputs()[0].name
        self._width = int(config["out_hidden_size"])  # the merger's output: one row per merged patch group

    def _grid_feeds(self, grid: tuple[int, int, int]) -> dict[str, np.ndarray]:
        feeds = grid_inputs(grid, self.config)
        for value in feeds.values():
            value.setflags(write=False)  # shared by every request of this grid
        return feeds

    @device_run
    def __call__(self, pixels: Pixels) -> np.ndarray:
        feeds = {"pixel_values": pixels.values, **self.grid_feeds(tuple(pixels.grid))}
        if self.graphs is None:
            return self.session.run(None, feeds)[0]
        shapes = {name: value.shape for name, value in feeds.items()}
        graph = self.graphs.graph(shapes, len(pixels.values), {self._output: (pixels.tokens, self._width)})
        if graph is None:
            return self.session.run(None, feeds, self._uncaptured)[0]
        graph.run(feeds)
        features = graph.outputs[self._output].numpy()
        return features if features.flags.owndata else features.copy()  # a CPU buffer's view: the next replay rewrites it


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def load_engine(path: Path, manifest: dict[str, Any], device: str = "cpu") -> OmniJevModel:
    """The model of an engine whose manifest (``manifest``) has been read and its files checked."""
    device = manifest.get("device", device)
    embedding = load_file(str(path / EMBEDDING))[EMBEDDING_TENSOR]
    config = _json(path / "config.json")
    release = _json(path / RELEASE)
    processor_config = _json(path / PROCESSOR_CONFIG) if (path / PROCESSOR_CONFIG).is_file() else None
    return OmniJevModel(
        Identity(**manifest["member"]),
        Release.read({**release, "calibration": _json(path / "calibration.json")}, config),
        Tokenizer.from_file(str(path / "tokenizer.json")),
        Processor.from_config(processor_config, release["max_pixels"]),
        VisionSession(path / VISION_GRAPH, config["vision_config"], device, manifest.get("provider_options"),
                      bool(manifest.get("vision_cuda_graphs"))),  # fmt: skip
        engine_runner(path, manifest, device, embedding),
        Heads.load(path / "heads.safetensors"),
        EngineLogProbs(embedding, device, manifest.get("provider_options")),
    )
