"""An export-friendly forward of transformers' ``Qwen3_5TextModel`` with explicit state.

Only what cannot be traced into one dynamic-length graph is replaced. The model's own modules run
unchanged: embeddings, rotary, decoder layers (norms, residuals, MLP), every projection and norm
inside the token mixers. The two token mixers are swapped, per instance and only while tracing
(``explicit_state_forward``), for versions that read and write an ``ExplicitState``:

- Gated DeltaNet: the causal conv runs over ``[conv window ; inputs]`` (the window is the last
  K-1 projected inputs of the prefix, zeros for a fresh prefix); the chunked delta rule keeps the
  reference's chunking (64 tokens from the row's first token, zeros after its last) and runs its
  inter-chunk recurrence as ``torch.ops.higher_order.scan``, which exports as one ONNX ``Scan``
  whatever the number of chunks. The reference's unit-triangular solve inside a chunk becomes a
  recursive block inverse: six levels of fixed 64x64 matmuls.
  With ``recurrence="fused"`` the rule is instead one ``s1omni::gated_delta_rule`` call, which the
  exporter lowers to ONNX Runtime's ``com.microsoft`` ``LinearAttention`` (``gated_delta``): one
  node per layer with CPU and CUDA kernels, where the ``Scan`` runs its body once per chunk.
- Attention: attends over ``[prefix K/V ; own K/V]`` with HF's additive mask (``KeyMask``: the key
  mask and causality), and records its K/V post-norm and post-RoPE, as HF caches them. In the
  portable graphs (``recurrence="scan"``) the queries go ``QUERY_CHUNKS["scan"]`` at a time through a
  ``scan`` (``chunked_attention``: one ONNX ``Scan``), each chunk's mask built inside from the key
  mask and its own query steps, so no ``[S, T]`` scores or mask of the whole sequence exist (the
  18,557-token calibration case prefills 5 rows 5,495 wide: 0.6 GB of mask and 2.4 GB each of
  scores and probabilities unchunked, for the tiny member's 4 heads). Every row's products, mask,
  softmax and weighted sum are the unchunked graph's, so ONNX Runtime's results are bitwise equal,
  except that a call of one query (a one-token block) has the unchunked MatMuls take MLAS's
  single-row kernel, whose sums run in another order (up to 4.8e-7 apart on the tiny member). The
  fused graphs attend unchunked: ONNX Runtime captures no CUDA graph of a model with control flow.

  The chunk size, from one prefill row of the tiny member on one thread of a 2-core CPU (ONNX
  Runtime 1.31): CPU time at 2,048 / 18,557 tokens and peak RSS at 18,557 were 0.16 s / 12.9 s /
  0.45 GB for 64 queries a chunk, 0.15 s / 13.0 s / 0.51 GB for 256, 0.22 s / 14.1 s / 1.04 GB for
  1,024; unchunked, 0.22 s at 2,048 and 12.4 GB at 18,557. 64 is as fast as any, needs the least
  memory (a chunk's scores grow with the heads: 16 heads over 18k keys are 76 MB a chunk), and is
  the delta rule's chunk, so the traced example and the export check's lengths cross its boundaries
  too (a trace whose rows all fit in one chunk would specialise the chunk count to 1).

Left-padded prefill rows: the Gated DeltaNet mixer rotates each row so its real tokens come first
(``Realign``), which reproduces the unpadded reference's chunk boundaries and end padding exactly;
attention, MLP and norms work per token and never see padded keys.

Packed blocks (``PackedForward``, the ``shared_context`` profile's graph): a tree's blocks one after
another in one row behind its prefix, without padding between them (``Packing``). Embeddings,
norms, projections and MLP run on the packed tokens. Each Gated DeltaNet layer gathers the blocks
into right-padded rows of their own and runs the continue mixer on them, each from its prefix's
conv and recurrent state: ONNX Runtime's ``LinearAttention`` has no variable-length form, and a
block must start from the prefix's state, not from the block before it. Attention reads the
prefix's keys once per row, not once per block: the packed queries score the prefix on the packed
row and their own block causally in block rows, one softmax runs over both, and each part's weighted
sum is taken in its own layout and added (``packed_attention``; the reference's ``shared_context``
merges the two parts by log-sum-exp instead, vela2.md §8). The result is ``exact``'s up to float32
rounding: the same keys and weights, summed in another order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn
from torch._higher_order_ops.scan import scan_op
from transformers.activations import ACT2FN

from s1omni.runtime.runners.qwen3_5 import modeling

_qwen3_5 = modeling()
apply_rotary_pos_emb, eager_attention_forward = _qwen3_5.apply_rotary_pos_emb, _qwen3_5.eager_attention_forward
l2norm, repeat_kv = _qwen3_5.l2norm, _qwen3_5.repeat_kv

CHUNK = 64  # the reference's chunk size (torch_chunk_gated_delta_rule's default, FLA's too)
# Queries per attention chunk in each recurrence's graphs; the fused (CUDA EP) graphs attend unchunked,
# as a Scan keeps ONNX Runtime from capturing CUDA graphs.
QUERY_CHUNKS: dict[str, int | None] = {"scan": 64, "fused": None}
MASKED = torch.finfo(torch.float32).min  # what HF's eager masks add: finite, so fully masked rows stay finite


def state_names(layer_types: list[str]) -> list[str]:
    """The state tensors in layer order: ``conv.i, recurrent.i`` per Gated DeltaNet layer, ``key.i, value.i`` per attention layer."""
    names = []
    for index, kind in enumerate(layer_types):
        names += [f"conv.{index}", f"recurrent.{index}"] if kind == "linear_attention" else [f"key.{index}", f"value.{index}"]
    return names


def rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[b, index[b, t]]`` for ``values`` ``[B, S, H]`` and ``index`` ``[B, T]``.

    One ``Gather`` over the flattened rows: an element-wise gather would need a ``[B, T, H]`` index.
    The row starts are one ``Range`` over shape values: a tensor times the symbolic width would copy
    the width from the host inside the graph, and ONNX Runtime captures no CUDA graph with such a copy.
    """
    batch, width, hidden = values.shape
    flat = index + torch.arange(0, batch * width, width, device=index.device)[:, None]
    return torch.index_select(values.reshape(batch * width, hidden), 0, flat.reshape(-1)).reshape(batch, -1, hidden)


@dataclass
class Realign:
    """Rotates left-padded rows so their real tokens come first, and back.

    ``front[b, t]`` is the padded index of rotated position t and ``back`` its inverse; ``tail`` marks
    the rotated positions holding real tokens.
    """

    valid: torch.Tensor  # bool [B, S], padded layout
    length: torch.Tensor  # int64 [B]
    front: torch.Tensor  # int64 [B, S]
    back: torch.Tensor  # int64 [B, S]
    tail: torch.Tensor  # bool [B, S], rotated layout

    @classmethod
    def from_mask(cls, valid: torch.Tensor) -> Realign:
        length, pads = valid.sum(-1), (~valid).sum(-1)
        # The row width as a tensor (length + pads): the exporter cannot take a remainder by a symbolic int.
        width = (length + pads)[:, None]
        steps = torch.arange(valid.shape[1], device=valid.device)[None, :]
        front = torch.remainder(steps + pads[:, None], width)
        back = torch.remainder(steps - pads[:, None] + width, width)
        return cls(valid, length, front, back, steps < length[:, None])


@dataclass
class KeyMask:
    """Which keys each query of one forward attends: key ``t`` of row ``b`` is seen by query step ``q``
    when ``valid[b, t]`` and ``order[t] <= q``. Prefill keys are the queries' own steps (causal over a
    left-padded row); continue keys are the prefix's (order -1: seen by every query) then the block's."""

    valid: torch.Tensor  # bool [B, T]
    order: torch.Tensor  # int64 [T]

    def allowed(self, queries: torch.Tensor) -> torch.Tensor:
        """bool ``[B, Q, T]`` for query steps ``queries`` ``[Q]``."""
        return self.valid[:, None, :] & (self.order[None, :] <= queries[:, None])[None]

    def bias(self, queries: torch.Tensor) -> torch.Tensor:
        """The additive mask ``[B, 1, Q, T]`` HF's eager attention takes: 0 where allowed, ``MASKED`` elsewhere."""
        return _bias(self.allowed(queries))


def _bias(allowed: torch.Tensor) -> torch.Tensor:
    zero = torch.zeros((), dtype=torch.float32, device=allowed.device)
    return torch.where(allowed, zero, zero + MASKED)[:, None]


@dataclass
class Packing:
    """Where the blocks of a packed forward lie. Rows (``R``, one per prefix) hold their blocks one after
    another (``T`` wide, right-padded); block rows (``N`` blocks, ``L`` wide) hold one block each.

    ``block_index`` ``[N, L]``: the flat packed position (``row * T + t``) of each block row's tokens,
    right-padded with the block's last; ``packed_index`` ``[R, T]``: the flat block-row position
    (``block * L + l``) of each packed token, any one for padding; ``owner`` ``[N]``: each block's row.
    """

    block_index: torch.Tensor
    packed_index: torch.Tensor
    owner: torch.Tensor
    prefix_bias: torch.Tensor  # [R, 1, 1, P]: 0 for a real prefix key, ``MASKED`` for padding
    own_bias: torch.Tensor  # [1, 1, L, L]: causal within a block row

    def to_blocks(self, values: torch.Tensor) -> torch.Tensor:
        """``[R, T, ...]`` packed values as ``[N, L, ...]`` block rows."""
        return _flat_gather(values, self.block_index)

    def to_packed(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, L, ...]`` block-row values as ``[R, T, ...]`` packed."""
        return _flat_gather(values, self.packed_index)


def _flat_gather(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values`` ``[A, B, ...]`` flattened over its first two axes, taken at ``index`` ``[C, D]``: ``[C, D, ...]``."""
    rest = values.shape[2:]
    flat = values.reshape(values.shape[0] * values.shape[1], *rest)
    return torch.index_select(flat, 0, index.reshape(-1)).reshape(index.shape[0], index.shape[1], *rest)


@dataclass
class ExplicitState:
    """What the patched mixers read (``past``, the key mask) and write (``present``) in one forward."""

    keys: KeyMask | None
    # ``keys.bias`` over every query [B, 1, S, P + S], before any layer, shared by the unchunked layers;
    # a graph whose layers all attend in chunks never reads it, and the exporter drops it.
    bias: torch.Tensor | None
    past: dict[str, torch.Tensor] = field(default_factory=dict)
    realign: Realign | None = None
    present: dict[str, torch.Tensor] = field(default_factory=dict)
    packing: Packing | None = None


def prefill_state(attention_mask: torch.Tensor) -> ExplicitState:
    """A fresh state for left-padded rows: causal attention over valid keys, realigned delta rule."""
    valid = attention_mask.bool()
    steps = torch.arange(valid.shape[1], device=valid.device)
    keys = KeyMask(valid, steps)
    return ExplicitState(keys, keys.bias(steps), realign=Realign.from_mask(valid))


def continue_state(past_mask: torch.Tensor, length: int, past: dict[str, torch.Tensor]) -> ExplicitState:
    """Blocks of ``length`` tokens after a prefix: the valid prefix keys, then their own keys causally."""
    batch, device = past_mask.shape[0], past_mask.device
    valid = torch.cat([past_mask.bool(), torch.ones(batch, length, dtype=torch.bool, device=device)], dim=-1)
    prefix = torch.full((past_mask.shape[1],), -1, dtype=torch.int64, device=device)
    steps = torch.arange(length, device=device)
    keys = KeyMask(valid, torch.cat([prefix, steps]))
    return ExplicitState(keys, keys.bias(steps), past=past)


def packed_state(
    past_mask: torch.Tensor, block_index: torch.Tensor, packed_index: torch.Tensor, owner: torch.Tensor, past: dict[str, torch.Tensor]
) -> ExplicitState:
    """Packed blocks (``Packing``) after left-padded prefixes whose keys ``past_mask`` marks."""
    steps = torch.arange(block_index.shape[1], device=block_index.device)
    causal = _bias((steps[None, :] <= steps[:, None])[None])
    packing = Packing(block_index, packed_index, owner, _bias(past_mask.bool()[:, None, :]), causal)
    return ExplicitState(None, None, past=past, packing=packing)


def unit_lower_inverse(system: torch.Tensor) -> torch.Tensor:
    """``(I + tril(system, -1))^-1`` over the last two axes, in log2(CHUNK) fixed-size steps.

    Recursive block inversion, all blocks of a level at once: if ``T`` inverts the diagonal
    b-blocks and ``E`` holds the lower b-blocks that join them in pairs, ``T - T E T`` inverts the
    2b-blocks (exactly, since ``E T E = 0``). As accurate as the forward substitution HF traces under
    torch.export (the product form ``(I+N)(I+N^2)(I+N^4)...`` was 2-5x less so) without its CHUNK-1
    dependent steps.
    """
    size = system.shape[-1]
    lower = system.tril(-1)
    block = torch.arange(size, device=system.device)

    def joins(width: int) -> torch.Tensor:
        pair, own = block // (2 * width), block // width
        return (pair[:, None] == pair[None, :]) & (own[:, None] != own[None, :])

    # Level 1 from T = I, written out so every matmul below is batch-shaped like ``system``.
    inverse = torch.eye(size, dtype=system.dtype, device=system.device) - lower * joins(1)
    width = 2
    while width < size:
        inverse = inverse - inverse @ (lower * joins(width)) @ inverse
        width *= 2
    return inverse


def scan(
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]], init: torch.Tensor, xs: Sequence[torch.Tensor], *operands: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``step(carry, xs[t], *operands) -> (carry, out)`` over the first axis of ``xs``: the final carry and
    every step's output, stacked. torch's ``scan`` operator called directly: ``torch._higher_order_ops.scan``'s
    wrapper first compiles the call with dynamo only to find the step's free tensors (1.6 of the 6 s the tiny
    member's portable prefill took to trace), which are passed here as ``operands``; the trace is the same."""
    count = len(xs)

    def flat(carry: torch.Tensor, *rest: torch.Tensor) -> list[torch.Tensor]:
        return list(step(carry, tuple(rest[:count]), *rest[count:]))

    carry, out = scan_op(flat, [init], list(xs), operands)
    return carry, out


def _chunk_step(recurrent: torch.Tensor, chunk: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the reference's scan: read the state, then update it (the ``Scan`` body)."""
    query, key, new_values, k_cumdecay, intra_chunk_attn, chunk_decay = chunk
    v_new = new_values - k_cumdecay @ recurrent
    out = query @ recurrent + intra_chunk_attn @ v_new
    recurrent = recurrent * chunk_decay + key.transpose(-1, -2) @ v_new
    return recurrent, out


def _chunk_count(length: torch.SymInt | int, size: int) -> tuple[torch.SymInt | int, torch.SymInt | int]:
    """Chunks of ``size`` covering ``length``, and the padding after it. Counted up front, so every padded
    size is plainly ``chunks * size`` to the symbolic shape checker."""
    chunks = (length + size - 1) // size
    return chunks, chunks * size - length


def _unchunked(
    per_chunk: torch.Tensor, batch: torch.SymInt | int, heads: torch.SymInt | int, chunks: torch.SymInt | int, size: int,
    pad_size: torch.SymInt | int,
) -> torch.Tensor:
    """A ``scan``'s per-chunk outputs ``[chunks, B, H, size, D]`` as ``[B, length, H, D]``. A copy, then a view:
    merging the chunk axis never depends on the number of chunks being 1 or more; cropping by negative
    padding keeps the length symbolically equal to the unpadded one."""
    merged = per_chunk.movedim(0, 2).clone(memory_format=torch.contiguous_format)
    merged = merged.view(batch, heads, chunks * size, per_chunk.shape[-1])
    return F.pad(merged, (0, 0, 0, -pad_size)).transpose(1, 2)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``torch_chunk_gated_delta_rule`` (qk l2-normalised) with a dynamic number of chunks.

    Same shapes, same operations in the same order; only the unit-triangular solve and the Python
    loop over chunks differ (``unit_lower_inverse`` and a ``scan``).
    """
    batch, sequence_length, heads, _ = key.shape
    query, key, value, beta, decay = [x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g)]
    query = l2norm(query, dim=-1, eps=1e-6)
    key = l2norm(key, dim=-1, eps=1e-6)
    query = query * query.shape[-1] ** -0.5

    chunks, pad_size = _chunk_count(sequence_length, CHUNK)
    query, key, value = (F.pad(x, (0, 0, 0, pad_size)) for x in (query, key, value))
    beta, decay = (F.pad(x, (0, pad_size)) for x in (beta, decay))
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = [x.reshape(batch, heads, chunks, CHUNK, x.shape[-1]) for x in (query, key, k_beta, v_beta)]
    decay = decay.reshape(batch, heads, chunks, CHUNK)
    strictly_upper_mask = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=query.device).triu(1)

    # torch accumulates a float32 cumsum in float64 on the CPU; saying so keeps ONNX Runtime's CumSum exact too.
    cum_decay = decay.double().cumsum(dim=3).to(torch.float32)
    pairwise_decay = cum_decay.unsqueeze(4) - cum_decay.unsqueeze(3)
    pairwise_decay = pairwise_decay.masked_fill(strictly_upper_mask, float("-inf")).exp()
    ut_system = (k_beta @ key.transpose(-1, -2)) * pairwise_decay
    intra_chunk_attn = (query @ key.transpose(-1, -2)) * pairwise_decay
    decayed_k_beta = k_beta * cum_decay.exp().unsqueeze(-1)
    # The reference's solve_triangular(ut_system, ..., unitriangular=True) for both right-hand sides.
    ut_inverse = unit_lower_inverse(ut_system)
    new_values, k_cumdecay = ut_inverse @ v_beta, ut_inverse @ decayed_k_beta

    query = query * cum_decay.exp().unsqueeze(-1)
    key = key * (cum_decay[..., -1:] - cum_decay).exp().unsqueeze(-1)
    chunk_decay = cum_decay[..., -1].exp()[..., None, None]

    per_chunk = [x.movedim(2, 0) for x in (query, key, new_values, k_cumdecay, intra_chunk_attn, chunk_decay)]
    final_state, core_attn_out = scan(_chunk_step, initial_state.to(torch.float32), per_chunk)
    return _unchunked(core_attn_out, batch, heads, chunks, CHUNK, pad_size), final_state


@torch.library.custom_op("s1omni::gated_delta_rule", mutates_args=())
def gated_delta_rule(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor, decay: torch.Tensor, beta: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule as ONNX Runtime's ``LinearAttention`` states it, token by token.

    ``query``/``key`` ``[B, T, heads*Dk]`` (l2-normalised), ``value`` ``[B, T, heads*Dv]``, ``state``
    ``[B, heads, Dk, Dv]``, ``decay`` (log space) and ``beta`` ``[B, T, heads]``; returns the output
    ``[B, T, heads*Dv]`` and the final state. Eager runs only (tests); exports lower it to the node.
    """
    batch, length, _ = query.shape
    q, k, v = (x.reshape(batch, length, heads, -1) for x in (query, key, value))
    q = q * q.shape[-1] ** -0.5
    outputs = []
    for t in range(length):
        state = state * decay[:, t].exp()[..., None, None]
        delta = (v[:, t] - (state * k[:, t, :, :, None]).sum(-2)) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outputs.append((state * q[:, t, :, :, None]).sum(-2))
    return torch.stack(outputs, 1).reshape(batch, length, -1), state


@gated_delta_rule.register_fake
def _gated_delta_rule_shapes(query, key, value, state, decay, beta, heads):
    return value.new_empty(value.shape), state.new_empty(state.shape)


def fused_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_gated_delta_rule``'s arguments and results, computed by one ``gated_delta_rule`` node."""
    batch, sequence_length, heads, _ = key.shape
    query, key = (l2norm(x.to(torch.float32), dim=-1, eps=1e-6).reshape(batch, sequence_length, -1) for x in (query, key))
    packed = value.to(torch.float32).reshape(batch, sequence_length, -1)
    out, final_state = torch.ops.s1omni.gated_delta_rule(
        query, key, packed, initial_state.to(torch.float32), g.to(torch.float32), beta.to(torch.float32), heads
    )
    return out.reshape(value.shape), final_state


RULES = {"scan": chunk_gated_delta_rule, "fused": fused_gated_delta_rule}


def gated_delta_net_forward(
    self, hidden_states: torch.Tensor, cache_params: ExplicitState, rule=chunk_gated_delta_rule, **kwargs
) -> torch.Tensor:
    """``Qwen3_5GatedDeltaNet.forward`` with the conv window and recurrent state in ``cache_params``;
    ``rule`` computes the delta rule (``RULES``). Packed blocks (``Packing``) run as block rows, each from its
    prefix's state."""
    state, realign = cache_params, cache_params.realign
    packing = state.packing
    if packing is not None:
        own = [f"conv.{self.layer_idx}", f"recurrent.{self.layer_idx}"]
        blocks = ExplicitState(None, None, past={name: torch.index_select(state.past[name], 0, packing.owner) for name in own})
        return packing.to_packed(gated_delta_net_forward(self, packing.to_blocks(hidden_states), blocks, rule))
    if realign is not None:
        # HF's apply_mask_to_padding_states, then each row's real tokens to the front.
        hidden_states = rows(hidden_states * realign.valid[..., None].to(hidden_states.dtype), realign.front)
    batch_size, seq_len, _ = hidden_states.shape
    window = self.conv_kernel_size - 1

    mixed_qkv = self.in_proj_qkv(hidden_states).transpose(1, 2)
    z = self.in_proj_z(hidden_states).reshape(batch_size, seq_len, -1, self.head_v_dim)
    b = self.in_proj_b(hidden_states)
    a = self.in_proj_a(hidden_states)

    past_conv = state.past.get(f"conv.{self.layer_idx}")
    if past_conv is None:
        past_conv = mixed_qkv.new_zeros(batch_size, self.conv_dim, window)
    mixed_qkv = torch.cat([past_conv, mixed_qkv], dim=-1)
    if realign is None:
        state.present[f"conv.{self.layer_idx}"] = mixed_qkv[:, :, -window:]
    else:
        last = realign.length[:, None] + torch.arange(window, device=mixed_qkv.device)
        state.present[f"conv.{self.layer_idx}"] = torch.gather(mixed_qkv, 2, last[:, None, :].expand(-1, self.conv_dim, -1))
    mixed_qkv = F.conv1d(mixed_qkv, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
    mixed_qkv = ACT2FN[self.activation](mixed_qkv)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    if realign is not None:
        # After the real tokens the reference's rule sees zero q/k/v and zero log-decay (its end padding).
        mixed_qkv = mixed_qkv * realign.tail[:, None, :].to(mixed_qkv.dtype)
        g = g * realign.tail[..., None].to(g.dtype)

    mixed_qkv = mixed_qkv.transpose(1, 2)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch_size, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch_size, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch_size, seq_len, -1, self.head_v_dim)
    if self.num_v_heads // self.num_k_heads > 1:
        query = query.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)
        key = key.repeat_interleave(self.num_v_heads // self.num_k_heads, dim=2)

    recurrent = state.past.get(f"recurrent.{self.layer_idx}")
    if recurrent is None:
        recurrent = torch.zeros(batch_size, self.num_v_heads, self.head_k_dim, self.head_v_dim, device=value.device)
    core_attn_out, state.present[f"recurrent.{self.layer_idx}"] = rule(query, key, value, g, beta, recurrent)

    core_attn_out = core_attn_out.to(value.dtype).reshape(-1, self.head_v_dim)
    core_attn_out = self.norm(core_attn_out, z.reshape(-1, self.head_v_dim)).reshape(batch_size, seq_len, -1)
    output = self.out_proj(core_attn_out)
    return output if realign is None else rows(output, realign.back)


def _query_chunk_step(
    carry: torch.Tensor, chunk: tuple[torch.Tensor, torch.Tensor], key_t: torch.Tensor, valid: torch.Tensor, order: torch.Tensor,
    value: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of queries over every key (the ``Scan`` body): HF's eager attention, its mask built for these rows only.
    ``key_t`` is the keys transposed once for all chunks ``[B, H, D, T]``; ``valid`` and ``order`` the ``KeyMask``'s."""
    query, steps = chunk
    keys = KeyMask(valid, order)
    weights = torch.matmul(query, key_t) * scaling + keys.bias(steps)
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return carry.clone(), torch.matmul(weights, value)


def chunked_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keys: KeyMask, size: int
) -> torch.Tensor:
    """transformers' ``eager_attention_forward`` (no dropout) over ``size`` queries at a time: ``[B, S, H, D]``.

    Each row's scores, mask, softmax and weighted sum are those of the unchunked call; only the
    ``[B, H, size, T]`` scores of one chunk exist at once. The chunks are a ``scan`` (one ONNX ``Scan``,
    whatever their number); the queries past the last are zeros whose rows are dropped.
    """
    batch, heads, length, head_dim = query.shape
    key, value = (repeat_kv(x, module.num_key_value_groups) for x in (key, value))
    chunks, pad_size = _chunk_count(length, size)
    query = F.pad(query, (0, 0, 0, pad_size)).reshape(batch, heads, chunks, size, head_dim).movedim(2, 0)
    steps = torch.arange(chunks * size, device=query.device).reshape(chunks, size)
    key_t = key.transpose(2, 3)
    # The step's operands in the order the step reads them, as dynamo's capture ordered them (the graph is the same).
    step = partial(_query_chunk_step, scaling=module.scaling)
    _, out = scan(step, query.new_zeros(()), (query, steps), key_t, keys.valid, keys.order, value)
    return _unchunked(out, batch, heads, chunks, size, pad_size)


def _grouped_scores(query: torch.Tensor, key: torch.Tensor, groups: int) -> torch.Tensor:
    """``query`` ``[B, H, Q, D]`` against ``key`` ``[B, H / groups, K, D]``, each key head serving ``groups``
    query heads, as ``repeat_kv`` pairs them: ``[B, H, Q, K]``. One ``bmm`` with the queries of a group
    stacked: repeating the keys would expand a state input, and a broadcasting ``matmul`` guards its
    lengths against 1, which a trace may not narrow."""
    batch, heads, queries, head_dim = query.shape
    length = key.shape[2]  # every size given: a -1 here leaves the trace a quotient it cannot simplify
    stacked = query.reshape(batch * (heads // groups), groups * queries, head_dim)
    keys = key.reshape(batch * (heads // groups), length, head_dim).transpose(1, 2)
    return torch.bmm(stacked, keys).reshape(batch, heads, queries, length)


def _grouped_values(weights: torch.Tensor, value: torch.Tensor, groups: int) -> torch.Tensor:
    """``weights`` ``[B, H, Q, K]`` times ``value`` ``[B, H / groups, K, D]`` per group (``_grouped_scores``): ``[B, H, Q, D]``."""
    batch, heads, queries, keys = weights.shape
    head_dim = value.shape[3]
    stacked = weights.reshape(batch * (heads // groups), groups * queries, keys)
    values = value.reshape(batch * (heads // groups), keys, head_dim)
    return torch.bmm(stacked, values).reshape(batch, heads, queries, head_dim)


def _heads_to_blocks(packing: Packing, values: torch.Tensor) -> torch.Tensor:
    """``[R, H, T, D]`` packed per head as ``[N, H, L, D]`` block rows."""
    return packing.to_blocks(values.transpose(1, 2)).transpose(1, 2)


def _heads_to_packed(packing: Packing, values: torch.Tensor) -> torch.Tensor:
    """``[N, H, L, D]`` block rows per head as ``[R, H, T, D]`` packed."""
    return packing.to_packed(values.transpose(1, 2)).transpose(1, 2)


def packed_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor, past_value: torch.Tensor,
    packing: Packing,
) -> torch.Tensor:
    """Softmax attention of packed queries ``[R, H, T, D]`` over their row's prefix keys and their own block's
    keys (causally): the prefix scores on the packed row (its keys read once, whatever the number of
    blocks), the block's own in block rows, brought beside them for one softmax over both, as ``exact``
    takes it; the weighted sums again in each layout, then added (the log-sum-exp merge, with the
    softmax's own normalisation). ``[R, T, H, D]``, as ``eager_attention_forward`` returns."""
    groups = module.num_key_value_groups
    prefix_scores = _grouped_scores(query, past_key, groups) * module.scaling + packing.prefix_bias
    own_query, own_key, own_value = (_heads_to_blocks(packing, x) for x in (query, key, value))
    own_scores = _heads_to_packed(packing, _grouped_scores(own_query, own_key, groups) * module.scaling + packing.own_bias)
    weights = F.softmax(torch.cat([prefix_scores, own_scores], dim=-1), dim=-1, dtype=torch.float32)
    # Copies, then views: reshaping a slice in place would depend on the prefix being 1 key or more.
    prefix_weights, own_weights = (
        part.clone(memory_format=torch.contiguous_format) for part in torch.split(weights, [prefix_scores.shape[-1], own_scores.shape[-1]], dim=-1)
    )
    own = _grouped_values(_heads_to_blocks(packing, own_weights), own_value, groups)
    return (_grouped_values(prefix_weights, past_value, groups) + _heads_to_packed(packing, own)).transpose(1, 2)


def attention_forward(
    self,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    past_key_values: ExplicitState,
    query_chunk: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``Qwen3_5Attention.forward`` over ``[prefix K/V ; own K/V]`` with the key mask of ``past_key_values``;
    ``query_chunk`` queries at a time (``chunked_attention``), or all at once with the whole mask; packed
    blocks as ``packed_attention``."""
    state = past_key_values
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states, gate = torch.chunk(self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim * 2), 2, dim=-1)
    gate = gate.reshape(*input_shape, -1)
    query_states = self.q_norm(query_states.view(hidden_shape)).transpose(1, 2)
    key_states = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

    state.present[f"key.{self.layer_idx}"], state.present[f"value.{self.layer_idx}"] = key_states, value_states
    past_key, past_value = state.past.get(f"key.{self.layer_idx}"), state.past.get(f"value.{self.layer_idx}")
    if state.packing is not None:
        attn_output = packed_attention(self, query_states, key_states, value_states, past_key, past_value, state.packing)
    else:
        if past_key is not None:
            key_states, value_states = torch.cat([past_key, key_states], dim=2), torch.cat([past_value, value_states], dim=2)
        if query_chunk is None:
            attn_output, _ = eager_attention_forward(self, query_states, key_states, value_states, state.bias, scaling=self.scaling)
        else:
            attn_output = chunked_attention(self, query_states, key_states, value_states, state.keys, query_chunk)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous() * torch.sigmoid(gate)
    return self.o_proj(attn_output), None


@contextmanager
def explicit_state_forward(model: nn.Module, recurrence: str = "scan") -> Iterator[None]:
    """Install the state-explicit mixers on ``model``'s layers for the duration of the block, then remove them.

    ``recurrence`` (one of ``RECURRENCES``) picks how the Gated DeltaNet layers compute their rule.
    """
    mixers = []
    for layer in model.layers:
        if layer.block_type == "linear_attention":
            mixers.append((layer.linear_attn, partial(gated_delta_net_forward, rule=RULES[recurrence])))
        else:
            mixers.append((layer.self_attn, partial(attention_forward, query_chunk=QUERY_CHUNKS[recurrence])))
    try:
        for module, forward in mixers:
            module.forward = MethodType(forward, module)
        yield
    finally:
        for module, _ in mixers:
            module.__dict__.pop("forward", None)


def _layers(model: nn.Module, hidden: torch.Tensor, position_ids: torch.Tensor, state: ExplicitState) -> torch.Tensor:
    """The text model's own forward from token embeddings, less its cache and mask plumbing: final-norm hidden states."""
    position_embeddings = model.rotary_emb(hidden, position_ids)
    for layer in model.layers:
        hidden = layer(hidden, position_embeddings=position_embeddings, past_key_values=state)
    return model.norm(hidden)


class PrefillForward(nn.Module):
    """``(input_ids, position_ids, attention_mask, readout_index) -> (hidden, *state)``: left-padded prefixes from zero state.

    With ``embeds`` the first input is ``inputs_embeds`` ``[B, S, H]`` instead: the caller looks the
    tokens up and puts a vision member's image features in place of its image placeholders.
    """

    def __init__(self, model: nn.Module, embeds: bool = False):
        super().__init__()
        self.model = model
        self.embeds = embeds
        self.names = state_names(model.config.layer_types)

    def forward(self, inputs, position_ids, attention_mask, readout_index):
        state = prefill_state(attention_mask)
        hidden = _layers(self.model, inputs if self.embeds else self.model.embed_tokens(inputs), position_ids, state)
        return (rows(hidden, readout_index), *(state.present[name] for name in self.names))


class ContinueForward(nn.Module):
    """``(input_ids, position_ids, past_mask, readout_index, *past state) -> hidden``: blocks after a prefix."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.names = state_names(model.config.layer_types)

    def forward(self, input_ids, position_ids, past_mask, readout_index, *past):
        state = continue_state(past_mask, input_ids.shape[1], dict(zip(self.names, past, strict=True)))
        hidden = _layers(self.model, self.model.embed_tokens(input_ids), position_ids, state)
        # Blocks are right-padded, so the state after them (state.present) is no state to continue from.
        return rows(hidden, readout_index)


class PackedForward(nn.Module):
    """``(input_ids, position_ids, past_mask, readout_index, block_index, packed_index, block_owner, *past state)
    -> hidden``: the blocks of each prefix packed into one row (``Packing``); readouts index the packed rows."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.names = state_names(model.config.layer_types)

    def forward(self, input_ids, position_ids, past_mask, readout_index, block_index, packed_index, block_owner, *past):
        state = packed_state(past_mask, block_index, packed_index, block_owner, dict(zip(self.names, past, strict=True)))
        hidden = _layers(self.model, self.model.embed_tokens(input_ids), position_ids, state)
        return rows(hidden, readout_index)
