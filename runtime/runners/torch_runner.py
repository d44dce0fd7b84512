"""The reference runner: transformers' own Qwen3.5 text model, eager.

On the CPU it runs in float32; on a GPU it follows the reference dtype policy (float32 weights,
BF16 autocast; the model's own code keeps the gated-delta gates and norms in float32). The
prefix runs once with a cache; the blocks of a tree continue from copies of that cache in one
right-padded batch, so each block sees the prefix and itself only.

Gated DeltaNet kernels (``kernels``). transformers picks the layers' gated delta rules when its
Qwen3.5 module is imported: flash-linear-attention's (``fla``) where ``import fla`` works, its own
torch functions otherwise (``transformers:integrations/hub_kernels.py``,
``use_kernel_func_from_hub_with_fallback``); this package imports it with fla hidden
(``s1omni.runtime.runners.qwen3_5``). The runner does not rely on that choice either: the layer's
forward looks its four functions (two rules, two causal convolutions) up by module-level name at
call time, and every call of a runner binds those names to its own functions, under one
process-wide lock, and puts the module's back afterwards. ``torch`` (the default) binds
transformers' torch functions (unwrapped from the import-time wrapper); ``fla`` binds FLA's two
rules (its Triton kernels, CUDA only) and keeps the torch convolutions (FLA ships no
``causal_conv1d``). Two runners of one model (``with_kernels``) share its weights.

Validation, serving and the export's check load the default, on a machine with FLA installed
too: the numerics reference is the readable torch path, the one the gates were measured against
and the same code on the CPU and the GPU, whose float32 arithmetic is the model's definition;
FLA's kernels are one fast implementation with their own accumulation order (and their own
faults), and an engine held to them would be held to another engine. FLA's speed is timed by
``s1omni bench`` (``s1omni.bench.references``). The export never reaches FLA: it traces the
model with its own token mixers (``s1omni.export.patches``), and transformers' wrapper runs the
torch function under ``torch.export`` anyway.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import importlib
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from ..errors import EnvironmentMissing
from .base import Block, BlockReady, Prefix, Tree, pad_blocks, run_one_by_one, text_positions
from .qwen3_5 import modeling

BACKBONE_PREFIX = "backbone."
KERNELS = ("torch", "fla")
FLA_RULES_MODULE = "fla.ops.gated_delta_rule"
# The module-level names ``Qwen3_5GatedDeltaNet.forward`` calls, and FLA's function for the two rules.
FLA_RULES = {"torch_chunk_gated_delta_rule": "chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule": "fused_recurrent_gated_delta_rule"}
LAYER_FUNCTIONS = (*FLA_RULES, "causal_conv1d_fn", "causal_conv1d_update")
_BINDING = threading.Lock()  # one runner's functions bound at a time


def _own_arguments(function: Callable) -> Callable:
    """``function`` given only the keyword arguments it names (the layer passes the torch rules' extras),
    as transformers' own wrapper calls it."""
    accepted = inspect.signature(function).parameters

    @functools.wraps(function)
    def call(*args, **kwargs):
        return function(*args, **{key: value for key, value in kwargs.items() if key in accepted})

    return call


def layer_functions(kernels: str) -> dict[str, Callable]:
    """What each of ``LAYER_FUNCTIONS`` is bound to while a runner of ``kernels`` runs."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels {kernels!r}: one of {', '.join(KERNELS)}")
    qwen3_5 = modeling()
    functions = {name: inspect.unwrap(getattr(qwen3_5, name)) for name in LAYER_FUNCTIONS}
    if kernels == "fla":
        try:
            rules = importlib.import_module(FLA_RULES_MODULE)
        except Exception as exc:  # not installed, or its Triton fails to load
            raise EnvironmentMissing(f"flash-linear-attention does not import here ({type(exc).__name__}: {exc})") from exc
        functions |= {name: _own_arguments(getattr(rules, fla_name)) for name, fla_name in FLA_RULES.items()}
    expected = {name: "fla." if kernels == "fla" and name in FLA_RULES else qwen3_5.__name__ for name in LAYER_FUNCTIONS}
    for name, function in functions.items():  # by the function object's own module, not by how it was found
        if not inspect.unwrap(function).__module__.startswith(expected[name]):
            raise RuntimeError(f"{name} resolved to {inspect.unwrap(function).__module__}, not {expected[name]}")
    return functions


def function_modules(functions: dict[str, Callable]) -> dict[str, str]:
    """The module that defines each bound function (``fla.ops.gated_delta_rule.chunk``, ``transformers...``)."""
    return {name: inspect.unwrap(function).__module__ for name, function in functions.items()}


@contextlib.contextmanager
def bound(functions: dict[str, Callable]) -> Iterator[None]:
    """The layer's module-level functions replaced by ``functions`` for the block, the module's own back after."""
    qwen3_5 = modeling()
    with _BINDING:
        saved = {name: getattr(qwen3_5, name) for name in functions}
        try:
            for name, function in functions.items():
                setattr(qwen3_5, name, function)
            yield
        finally:
            for name, function in saved.items():
                setattr(qwen3_5, name, function)


def text_config(backbone_config: dict[str, Any]):
    """transformers' ``Qwen3_5TextConfig`` from a package's ``backbone_config`` (bookkeeping keys dropped)."""
    from transformers import Qwen3_5TextConfig

    fields = {k: v for k, v in backbone_config.items() if k not in ("architectures", "transformers_version", "model_type")}
    return Qwen3_5TextConfig(**fields)


def read_prefixed(paths: Sequence[Path], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named ``prefix*`` in safetensors files, with the prefix stripped."""
    tensors = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if name.startswith(prefix):
                    tensors[name[len(prefix) :]] = handle.get_tensor(name)
    return tensors


def eager_config(backbone_config: dict[str, Any]):
    """``text_config`` with eager attention, the implementation the reference and the export run."""
    config = text_config(backbone_config)
    config._attn_implementation = "eager"
    return config


def empty_backbone(config):
    """The Qwen3.5 text model of ``config`` with its weights on the ``meta`` device (no storage) and its
    non-persistent buffers (the rotary frequencies) rebuilt from the config."""
    with torch.device("meta"):
        model = modeling().Qwen3_5TextModel(config)
    model.rotary_emb = type(model.rotary_emb)(config=config)
    return model.eval()


def load_backbone(backbone_config: dict[str, Any], shards: Sequence[Path], prefix: str = BACKBONE_PREFIX):
    """The Qwen3.5 text model with the ``backbone.*`` tensors loaded strictly, in float32."""
    model = empty_backbone(eager_config(backbone_config))
    state = {name: value.float() for name, value in read_prefixed(shards, prefix).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.float().eval()


def release_gpu_memory() -> None:
    """Hand the GPU memory of dropped torch models back to the device: torch's caching allocator keeps
    freed blocks, and an engine or server loaded next needs them (a 9B float32 engine ran out of memory
    on the H200 beside a dropped 9B reference). Only where torch already runs on CUDA in this process."""
    gc.collect()  # so that no reference cycle keeps the weights alive
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def reference_device(device: str, precision: str | None) -> tuple[str, str]:
    """The torch reference's device kind and precision on ``device``: ``precision`` bf16 (the reference's GPU
    policy, BF16 autocast over float32 weights; the GPU default) or fp32 (TF32 off on a GPU; the CPU's only)."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise EnvironmentMissing(f"device {device}: torch {torch.__version__} sees no CUDA GPU here")
    precision = precision or ("bf16" if kind == "cuda" else "fp32")
    if kind == "cpu" and precision != "fp32":
        raise ValueError("the CPU reference runs in float32")
    if kind == "cuda" and precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return kind, precision


def precision_policy(precision: str) -> contextlib.AbstractContextManager[Any]:
    """What a reference forward runs under: BF16 autocast at bf16, nothing at fp32."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


class TorchRunner:
    name = "torch"

    def __init__(self, model, device: str = "cpu", precision: str | None = None, kernels: str = "torch"):
        """``precision`` bf16 (the reference's GPU policy: BF16 autocast) or fp32 (TF32 off on a GPU);
        ``kernels`` torch (transformers' torch functions) or fla (FLA's gated delta rules)."""
        self.device, self.precision = reference_device(device, precision)
        self.kernels = kernels
        self.functions = layer_functions(kernels)
        self.model = model.to(device)
        self.hidden_size = int(model.config.hidden_size)
        self._torch_device = torch.device(device)

    @classmethod
    def from_package(
        cls, backbone_config: dict[str, Any], shards: Sequence[Path], device: str = "cpu", precision: str | None = None
    ) -> TorchRunner:
        return cls(load_backbone(backbone_config, shards), device, precision)

    def with_kernels(self, kernels: str) -> TorchRunner:
        """A runner of the same model (the same weights, no copy) with other Gated DeltaNet kernels."""
        return TorchRunner(self.model, str(self._torch_device), self.precision, kernels)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """This runner's layer functions bound, under BF16 autocast where its precision says so."""
        with bound(self.functions), precision_policy(self.precision):
            yield

    def _embeddings(self, ids: torch.Tensor, prefix: Prefix | None = None) -> torch.Tensor:
        embeds = self.model.embed_tokens(ids)
        if prefix is not None and prefix.embeds is not None:
            index = torch.as_tensor(prefix.embed_index, device=embeds.device)
            embeds[0, index] = torch.as_tensor(prefix.embeds, device=embeds.device, dtype=embeds.dtype)
        return embeds

    @torch.inference_mode()
    def prefill(self, prefix: Prefix) -> Any:
        ids = torch.as_tensor(prefix.ids, dtype=torch.long, device=self._torch_device)[None]
        positions = prefix.positions if prefix.positions is not None else text_positions(0, len(prefix.ids))
        position_ids = torch.as_tensor(positions, device=self._torch_device)[:, None, :]
        with self._running():
            out = self.model(
                inputs_embeds=self._embeddings(ids, prefix),
                position_ids=position_ids,
                use_cache=True,
            )
        return out.past_key_values

    @torch.inference_mode()
    def continue_blocks(self, state: Any, prefix: Prefix, blocks: Sequence[Block]) -> list[np.ndarray]:
        """Hidden states at each block's readouts, every block continuing from ``state``."""
        if not blocks:
            return []
        ids, readouts = pad_blocks(blocks)
        count, width = ids.shape
        cache = copy.deepcopy(state)
        cache.reorder_cache(torch.zeros(count, dtype=torch.long, device=self._torch_device))
        positions = text_positions(prefix.start, width)
        position_ids = torch.as_tensor(np.broadcast_to(positions[:, None, :], (3, count, width)).copy(), device=self._torch_device)
        block_ids = torch.as_tensor(ids, device=self._torch_device)
        with self._running():
            hidden = self.model(
                inputs_embeds=self._embeddings(block_ids),
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
        hidden = hidden.float().cpu().numpy()
        return [hidden[row, block.readouts] for row, block in enumerate(blocks)]

    def run(self, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]:
        return run_one_by_one(self, trees, ready)

    @torch.inference_mode()
    def forward(self, ids: np.ndarray, positions: np.ndarray | None = None, embedded: Prefix | None = None) -> np.ndarray:
        """One plain causal forward over ``ids`` (all hidden states, ``[len, H]``): the tree's definition.
        ``embedded``: a prefix of ``ids`` whose ``embeds`` replace the token embeddings at its ``embed_index``."""
        tokens = torch.as_tensor(ids, dtype=torch.long, device=self._torch_device)[None]
        positions = positions if positions is not None else text_positions(0, len(ids))
        with self._running():
            out = self.model(inputs_embeds=self._embeddings(tokens, embedded), position_ids=torch.as_tensor(positions, device=self._torch_device)[:, None, :])
        return out.last_hidden_state[0].float().cpu().numpy()
