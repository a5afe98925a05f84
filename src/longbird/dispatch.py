"""Which sparse kernel runs a call: the blocked kernels (portable, CPU training) or compiled flex_attention.

Chosen per call from the device, autograd and length, with the reason logged (logger "longbird.attention":
INFO when the choice changes, DEBUG on every call). Measured reasons behind the rules (docs/gpu.md, "Kernels and
backends"):
- CUDA inference: compiled flex on exact b-token tiles, the fastest kernel (H100, 16K tokens, base heads: the USW
  window on 64-token tiles 0.14 ms against the blocked USW kernel's 3.1 ms; benchmarks/results/flex_variants_h100.md).
- CUDA training: flex's backward kernels need 128-token tiles, where the b-block pattern must be carved by a
  per-token mask_mod that costs ~10x in the tiles it runs in; the blocked kernels are faster there, so they train.
- CPU: flex has no backward, so training uses the blocked kernels. For inference in fp32, compiled flex is faster for
  LittleBird's USW kernel from CPU_FLEX_MIN_LENGTH tokens on (below that the first call's compile time is never
  repaid); for BigBird rows the blocked kernels are as fast at base-size heads and faster at e5-small heads
  (benchmarks/results/flex_cpu_fp32_small_rerun.md, flex_cpu_fp32_base_rerun.md), so BigBird never takes flex on CPU.
  In half precision the blocked kernels (SDPA) are faster for both.
A compile or kernel failure (no C++ compiler, an unsupported GPU, an Inductor code-generation bug) logs a warning once
(the compiler's whole message with `longbird --verbose`) and falls back to the blocked kernels. The failure is
remembered for its family (kernel, device and capability, torch version, head dimension, dtype) across processes in
the cache directory (`flex_failures.py`), so the next process skips the failed compilation instead of paying for it.
Shapes as in `longbird.attention` (B batch, H heads, l length, d head size, b block size).
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import flex_failures
from .attention import (
    bigbird_attention,
    cpu_kernel,
    full_attention,
    reference_attention,
    usw_attention,
    usw_attention_reference,
    usw_layout,
)
from .attention.device_rows import bigbird_rows_on_device
from .attention.flex import bigbird_flex_attention, usw_flex_attention
from .attention.littlebird import BiALiBiSlopes, USWLayout
from .attention.patterns import BigBirdPattern, bigbird_pattern
from .attention.rows import RowGroup, cut_to_group, place_group, plan_rows
from .attention.token_major import empty_token_major, in_token_major_layout
from .attention.tracing import exporting, is_tracing

BACKENDS = ("auto", "blocked", "flex")
# From benchmarks/results/flex_cpu.md and flex_cpu_fp32_*_rerun.md (`python benchmarks/flex_cpu.py`): compiled flex
# beats the blocked USW kernel for fp32 CPU inference from 4096 tokens on (model forward); BigBird rows never take it
# on CPU (kernel="bigbird" in choose_backend).
CPU_FLEX_MIN_LENGTH = 4096
KERNELS = ("bigbird", "usw")
FLEX_MIN_BLOCK_SIZE = 16

logger = logging.getLogger("longbird.attention")
_last_logged: tuple[str, str] | None = None


@dataclass(frozen=True)
class SparseBackend:
    """The kernel chosen for one forward call. `strict`: an explicit request for flex, never silently replaced."""

    name: str = "blocked"
    reason: str = "default"
    strict: bool = False

    def run(self, flex_call: Callable[[], torch.Tensor], blocked_call: Callable[[], torch.Tensor],
            query: torch.Tensor, kernel: str) -> torch.Tensor:
        """`kernel` ("bigbird" or "usw") and `query` (B, H, l, d) name the compilation's family. Called only by the
        family functions below, with both kernels' calls written next to each other."""
        if self.name != "flex":
            return blocked_call()
        key = flex_failures.family(kernel, query)
        # Once flex failed for this family (in any process), every later call (a checkpoint's recomputation too)
        # takes the blocked kernel; an explicit request for flex still tries, and raises.
        if not self.strict and flex_failures.known_failure(key) is not None:
            return blocked_call()
        try:
            return flex_call()
        except Exception as error:  # compile/kernel failure: fall back unless flex was asked for
            mark_broken(key, error)
            if self.strict:
                raise
        return blocked_call()


def choose_backend(requested: str, device: torch.device, length: int, block_size: int,
                   attention_dropout: bool = False, repeated_blocks: bool = False,
                   position_states: bool = False, dtype: torch.dtype = torch.float32,
                   kernel: str = "bigbird", head_size: int | None = None) -> SparseBackend:
    """The backend for one call; `requested` is the config's attention_backend (or LONGBIRD_ATTENTION_BACKEND).
    `attention_dropout`: the call applies attention dropout (training with attention_probs_dropout_prob > 0).
    `repeated_blocks`: the pattern counts a key block more than once (random_blocks="transformers").
    `position_states`: TAPE states ride beside V (values wider than the queries), which the flex path does not take.
    `dtype`: the dtype the attention computes in (autocast's, when it is on).
    `kernel`: "bigbird" (BigBird rows) or "usw" (LittleBird's sliding window): on CPU they differ in which is faster.
    `head_size`: the attention heads' width, which decides whether longbird's fused CPU kernel takes the call."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if position_states:
        return SparseBackend("blocked", "TAPE: the position states ride beside V, wider than the flex path takes")
    requested = os.environ.get("LONGBIRD_ATTENTION_BACKEND", requested)
    if requested not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}; got {requested!r}")
    grad = torch.is_grad_enabled()
    if requested == "blocked":
        return _logged("blocked", "attention_backend='blocked'")
    unusable = _flex_unusable(device, grad, block_size)
    if attention_dropout:  # flex has no dropout on the probabilities; the blocked kernels apply it
        unusable = "attention dropout in training: flex_attention cannot apply it (attention_probs_dropout_prob > 0)"
    # export/compile/ONNX trace the blocked kernels as plain ops; compiled flex inside a trace does not
    if is_tracing():
        unusable = "the model is being traced (torch.export, torch.compile or ONNX): the blocked kernels are plain ops"
    if repeated_blocks:  # a BlockMask lists a key block once; the transformers plan counts block 0 1 + r times
        unusable = "random_blocks='transformers' counts block 0 several times, which a flex BlockMask cannot"
    if requested == "flex":
        if unusable:
            raise ValueError(f"attention_backend='flex' cannot run here: {unusable}; use attention_backend='auto' "
                             "or 'blocked'")
        return _logged("flex", "attention_backend='flex'", strict=True)
    if unusable:
        return _logged("blocked", unusable)
    if device.type == "cuda":
        if grad:
            return _logged("blocked", "CUDA training: the blocked kernels are faster than flex's 128-token backward "
                                      "tiles (measured)")
        return _logged("flex", "CUDA inference: compiled flex_attention on exact block tiles")
    if dtype in (torch.bfloat16, torch.float16):
        return _logged("blocked", "CPU inference in half precision: the blocked kernels (SDPA) are faster than "
                                  "compiled flex_attention (measured: benchmarks/results/flex_cpu_bf16.md)")
    if kernel == "bigbird":
        return _logged("blocked", "CPU inference, BigBird rows: the blocked kernels are as fast as compiled "
                                  "flex_attention at base-size heads and faster at e5-small heads (measured: "
                                  "benchmarks/results/flex_cpu_fp32_small_rerun.md)")
    fused = head_size is None or cpu_kernel.takes_head_size(head_size, dtype)
    if block_size % 32 == 0 and fused and cpu_kernel.available(dtype):
        return _logged("blocked", "CPU inference, LittleBird: longbird's fused fp32 kernel is faster than compiled "
                                  "flex_attention (measured with AVX-512 and with AVX2: docs/benchmarks.md, \"The "
                                  "fused kernel in fp32\" and \"The fused kernel on AVX2 CPUs\")")
    if length < CPU_FLEX_MIN_LENGTH:
        return _logged("blocked", f"CPU inference below {CPU_FLEX_MIN_LENGTH} tokens: the blocked kernel is faster "
                                  "once compile time is counted")
    return _logged("flex", f"CPU inference at {length} tokens: compiled flex_attention is faster (measured)")


def _flex_unusable(device: torch.device, grad: bool, block_size: int) -> str | None:
    if device.type == "cpu" and grad:
        return "CPU with autograd on: flex_attention has no backward on CPU"
    if device.type == "cuda" and block_size < FLEX_MIN_BLOCK_SIZE:
        return f"block_size {block_size} < {FLEX_MIN_BLOCK_SIZE}: too small for flex_attention's GPU tiles"
    if device.type not in ("cpu", "cuda"):
        return f"flex_attention is not used on {device.type}"
    return None


def mark_broken(key: str, error: Exception) -> None:
    """Remember that flex failed for this family, here and for later processes; later calls take the blocked
    kernels. The warning names the error; `longbird --verbose` (LONGBIRD_VERBOSE=1) adds the compiler's message."""
    failure = flex_failures.remember_failure(key, error)
    detail = f"\n{failure['detail']}" if os.environ.get("LONGBIRD_VERBOSE") == "1" else " (--verbose shows the error)"
    logger.warning("flex_attention failed for %s (%s); using the blocked kernels, in later processes too (recorded "
                   "in %s; delete it to retry)%s", key, failure["error"], failure["record"], detail)


def _logged(backend: str, reason: str, strict: bool = False) -> SparseBackend:
    global _last_logged
    if is_tracing():  # a traced graph has no logging calls (dynamo would break the graph there); eager calls log
        return SparseBackend(backend, reason, strict)
    if _last_logged != (backend, reason):
        logger.info("sparse attention backend: %s (%s)", backend, reason)
        _last_logged = (backend, reason)
    logger.debug("sparse attention backend: %s (%s)", backend, reason)
    return SparseBackend(backend, reason, strict)


def bigbird(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor,
            groups: list[RowGroup] | None, patterns: list[BigBirdPattern | None] | None, backend: SparseBackend | None,
            workspace: dict | None = None, dropout_p: float = 0.0, reference: bool = False) -> torch.Tensor:
    """Attention of a BigBird (or full) layer: query/key (B, H, l, d), value (B, H, l, d_v), key_mask (B, l) bool.

    `groups`/`patterns`: the call's row groups (attention/rows.py) and this layer's pattern per group (None = full
    attention), or None for full attention over every row. Each group runs on its rows cut to its length: full
    attention (SDPA), or BigBird ITC on compiled flex or the blocked kernel as `backend` says; `reference` runs the
    dense oracle with the same pattern as a mask instead. Returns (B, H, l, d_v), 0 past a row's group length."""
    if groups is None:
        return _bigbird_group(query, key, value, key_mask, None, backend, workspace, dropout_p, reference)
    length = query.shape[2]
    if len(groups) == 1 and groups[0].rows is None and groups[0].length == length:
        return _bigbird_group(query, key, value, key_mask, patterns[0], backend, workspace, dropout_p, reference)
    out = query.new_zeros(query.shape[:-1] + (value.shape[-1],))
    for group, pattern in zip(groups, patterns):
        q, k, v, mask = (cut_to_group(x, group) for x in (query, key, value, key_mask))
        out = place_group(out, group, _bigbird_group(q, k, v, mask, pattern, backend, workspace, dropout_p, reference))
    return out


@dataclass(frozen=True)
class PlanInGraph:
    """A BigBird layer's per-row plan made inside the `longbird::bigbird_rows_token_major` op instead of by the
    encoder: what a torch.compile graph carries, since the plan reads each row's real length from the mask
    (attention/rows.py), which a graph cannot branch on. The op is opaque to the compiler (one node, no graph break);
    on a GPU its length read is still a host synchronisation, which CUDA graphs cannot capture."""

    layer: int
    block_size: int
    full_max_length: int
    num_random_blocks: int
    seed: int
    random_blocks: str
    first_block_reach: int = 0
    last_global: bool = True
    chunk_blocks: int = 0
    max_length: int = 0  # the model's longest input (max_position_embeddings): bounds the device plan's tables

    @property
    def max_blocks(self) -> int:
        return self.max_length // self.block_size


_OP_WORKSPACES = threading.local()
_OP_WORKSPACE_BYTES = 256 * 2**20  # gather buffers kept per thread between calls (the rest is freed)


def _op_workspace(device: torch.device) -> dict | None:
    """The gather buffers of `bigbird_rows` calls on this thread (CPU only): the eager encoder shares one workspace
    among the layers of a call, but a compiled graph calls the op once per layer with nothing to carry between them,
    and fresh multi-MB buffers in every layer cost page faults (compiled kobigbird at 8K ran 1.03-1.28x eager's time).
    Per thread, since a server may run forwards concurrently; cleared once it holds more than 256 MiB per mode (every
    new length brings new shapes); used only without autograd (`scratch_buffer`), and the op's output never aliases a
    buffer. None on other devices, whose caching allocators already reuse memory. Only scratch buffers may live here:
    the op runs the blocked kernels, whose one other workspace use (flex's per-call block masks) it never reaches."""
    if device.type != "cpu":
        return None
    # one workspace per inference mode: a buffer made under torch.inference_mode() may not be written outside it
    # (this runs inside the opaque op, never traced, so it may ask which mode it is in)
    workspaces = getattr(_OP_WORKSPACES, "buffers", None)
    if workspaces is None:
        workspaces = _OP_WORKSPACES.buffers = {}
    inference = torch.is_inference_mode_enabled()
    workspace = workspaces.get(inference)
    if workspace is None or sum(buffer.nbytes for buffer in workspace.values()) > _OP_WORKSPACE_BYTES:
        workspace = workspaces[inference] = {}
    return workspace


def _rows_eagerly(query, key, value, key_mask, plan: PlanInGraph) -> torch.Tensor:
    """The encoder's eager per-row plan and the blocked kernels, for one layer (what `bigbird_rows` computes)."""
    groups = plan_rows(key_mask, plan.block_size, plan.full_max_length)
    patterns = [bigbird_pattern(group.num_blocks, plan.block_size, query.shape[1], plan.num_random_blocks, plan.seed,
                                plan.layer, plan.random_blocks, plan.first_block_reach, plan.last_global,
                                plan.chunk_blocks)
                if group.sparse else None for group in groups]
    return bigbird(query, key, value, key_mask, groups, patterns, SparseBackend("blocked", "compiled graph"),
                   workspace=_op_workspace(query.device))


def _plan_arguments(plan: PlanInGraph) -> tuple:
    return (plan.layer, plan.block_size, plan.full_max_length, plan.num_random_blocks, plan.seed, plan.random_blocks,
            plan.first_block_reach, plan.last_global, plan.chunk_blocks)


# The plan inside reads each row's length, a host synchronisation on a GPU, which a CUDA graph capture cannot hold:
# tagged, torch.compile(mode="reduce-overhead") graphs the rest of the model around the op (Inductor's graph
# partitions) or runs without CUDA graphs, instead of failing in capture. Older torch has no tag (or no `tags=`).
_CUDAGRAPH_UNSAFE = ({"tags": (torch.Tag.cudagraph_unsafe,)} if hasattr(torch.Tag, "cudagraph_unsafe") and "tags" in
                     inspect.signature(torch.library.custom_op).parameters else {})


# The op's name says the layout it returns (`attention.token_major`): Inductor's and AOTAutograd's caches key a graph
# by the ops it calls, not by their fake kernels, so a graph cached when the op returned another layout would assert
# on this one's strides. A change of the output's layout takes a new name.
@torch.library.custom_op("longbird::bigbird_rows_token_major", mutates_args=(), **_CUDAGRAPH_UNSAFE)
def _bigbird_rows_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor, layer: int,
                     block_size: int, full_max_length: int, num_random_blocks: int, seed: int,
                     random_blocks: str, first_block_reach: int, last_global: bool, chunk_blocks: int) -> torch.Tensor:
    plan = PlanInGraph(layer, block_size, full_max_length, num_random_blocks, seed, random_blocks, first_block_reach,
                       last_global, chunk_blocks)
    with torch.no_grad():
        return in_token_major_layout(_rows_eagerly(query, key, value, key_mask, plan))


@_bigbird_rows_op.register_fake
def _(query, key, value, key_mask, layer, block_size, full_max_length, num_random_blocks, seed, random_blocks,
      first_block_reach, last_global, chunk_blocks):
    return empty_token_major(query, value.shape[-1])


@torch.library.custom_op("longbird::bigbird_rows_backward", mutates_args=(), **_CUDAGRAPH_UNSAFE)
def _bigbird_rows_backward_op(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              key_mask: torch.Tensor, layer: int, block_size: int, full_max_length: int,
                              num_random_blocks: int, seed: int, random_blocks: str, first_block_reach: int,
                              last_global: bool, chunk_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The layer's attention again, under autograd, and its vector-Jacobian product: the eager blocked kernels' gradients
    # (recomputing the attention costs one more attention forward per layer, not a whole layer).
    # torch.func.vjp, not torch.autograd.grad: an op's kernel runs below the autograd dispatch keys, where autograd
    # records nothing even under enable_grad; functorch's transform differentiates there.
    plan = PlanInGraph(layer, block_size, full_max_length, num_random_blocks, seed, random_blocks, first_block_reach,
                       last_global, chunk_blocks)
    _, vjp = torch.func.vjp(lambda q, k, v: _rows_eagerly(q, k, v, key_mask, plan), query, key, value)
    # laid out as the inputs are (the fake kernel below says empty_like; q, k, v are head views of the projections)
    return tuple(torch.empty_like(x).copy_(g) for g, x in zip(vjp(grad), (query, key, value)))


@_bigbird_rows_backward_op.register_fake
def _(grad, query, key, value, key_mask, layer, block_size, full_max_length, num_random_blocks, seed, random_blocks,
      first_block_reach, last_global, chunk_blocks):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _rows_setup_context(ctx, inputs, output):
    query, key, value, key_mask, *plan = inputs
    ctx.save_for_backward(query, key, value, key_mask)
    ctx.plan = plan


def _rows_backward(ctx, grad):
    query, key, value, key_mask = ctx.saved_tensors
    grads = _bigbird_rows_backward_op(grad, query, key, value, key_mask, *ctx.plan)
    return (*grads, None, *([None] * len(ctx.plan)))


_bigbird_rows_op.register_autograd(_rows_backward, setup_context=_rows_setup_context)


ROW_PLANS = ("device", "op")


def compiled_row_plan() -> str:
    """Where a compiled graph makes BigBird's per-row plan: "device" (`attention.device_rows`: from each row's length
    on the device, no host synchronisation, so a CUDA graph holds the whole forward) or "op" (the
    `longbird::bigbird_rows_token_major` op, which reads the lengths on the host and runs the eager blocked kernels).
    `LONGBIRD_ROW_PLAN` chooses; "op" by default on every device. On CPU there is no synchronisation to avoid and the
    op was faster in inference (e5-small fp32 at 4K, AVX2: compiled at 0.94 of eager's time against 0.97, and 0.90
    against 1.01 in a first pair; docs/benchmarks.md, "BigBird's per-row plan in a compiled graph"). On CUDA the device
    plan does not compile with torch 2.11 (an H200, 2026-11-28: Inductor's loop merging fails, "The argument
    '((-1)) + 1' is not comparable"), while the op compiles, also under CUDA graphs, which leave the op out
    (docs/gpu.md). `device` stays the plan of torch.export, where it compiles (`bigbird_rows`)."""
    choice = os.environ.get("LONGBIRD_ROW_PLAN", "").strip().lower()
    if choice and choice not in ROW_PLANS:
        raise ValueError(f"LONGBIRD_ROW_PLAN must be one of {ROW_PLANS} (or unset); got {choice!r}")
    return choice or "op"


def bigbird_rows(query, key, value, key_mask, plan: PlanInGraph, dropout_p: float = 0.0) -> torch.Tensor:
    """BigBird attention of one layer with each row's own plan made inside the compiled or exported graph
    (`PlanInGraph`). torch.compile: on the device or in one opaque op (`compiled_row_plan`). torch.export (and the
    ONNX exporter built on it): always on the device, so the graph is plain ATen ops that ONNX Runtime runs, and one
    graph serves every sparse length. The op's backward draws attention dropout again when it recomputes the
    attention, so it refuses dropout; the device plan takes it."""
    if exporting() or compiled_row_plan() == "device":
        return bigbird_rows_on_device(query, key, value, key_mask, plan, dropout_p)
    if dropout_p:
        raise ValueError("torch.compile of a kobigbird model in training on CPU needs attention_probs_dropout_prob = 0 "
                         "(the default after conversion): the compiled per-row op recomputes attention in backward; "
                         "or set LONGBIRD_ROW_PLAN=device, whose plan is made on the device and takes dropout")
    return _bigbird_rows_op(query, key, value, key_mask, *_plan_arguments(plan))


def _bigbird_group(query, key, value, key_mask, pattern, backend, workspace, dropout_p, reference):
    if reference:
        mask, bias = key_mask[:, None, None, :], None
        if pattern is not None:
            counts = pattern.materialize_counts().to(key_mask.device)[None]
            mask = mask & (counts > 0)
            # A key block counted k times (the transformers plan) weighs k·exp(s) in the softmax: bias log k.
            bias = counts.clamp(min=1).float().log() if pattern.repeats_blocks else None
        return reference_attention(query, key, value, mask, bias, dropout_p=dropout_p, record_pack_keys=0)
    if pattern is None:
        return full_attention(query, key, value, key_mask, dropout_p)
    return (backend or SparseBackend()).run(
        lambda: bigbird_flex_attention(query, key, value, key_mask, pattern, workspace=workspace),
        lambda: bigbird_attention(query, key, value, key_mask, pattern, workspace, dropout_p),
        query, "bigbird")


def usw(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor, positions: torch.Tensor,
        bialibi: BiALiBiSlopes, block_size: int, pack_key: torch.Tensor | None, pack_value: torch.Tensor | None,
        backend: SparseBackend | None, layout: USWLayout | None = None, workspace: dict | None = None,
        dropout_p: float = 0.0, scale: float | None = None, reference: bool = False) -> torch.Tensor:
    """LittleBird's unpack & sliding-window attention (LittleBird §3.3) for one layer: query/key (B, H, l, d), value
    (B, H, l, d_v), l a multiple of `block_size`; position ids (B, l); pack keys/values (B, H, s, d / d_v) or None.
    Compiled flex or the blocked kernel as `backend` says (the blocked kernel reads `layout`, built here when the
    caller has none); `reference` runs the dense oracle. `scale` replaces 1/√d (TAPE widens q and k)."""
    if reference:
        return usw_attention_reference(query, key, value, key_mask, positions, bialibi, block_size, pack_key,
                                       pack_value, scale)
    return (backend or SparseBackend()).run(
        lambda: usw_flex_attention(query, key, value, key_mask, positions, bialibi, block_size, pack_key, pack_value,
                                   workspace=workspace),
        lambda: usw_attention(query, key, value, layout or usw_layout(key_mask, positions, block_size, bialibi),
                              bialibi, pack_key, pack_value, workspace, dropout_p, scale),
        query, "usw")
