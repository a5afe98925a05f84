"""`--compile`: a loaded model's encoder compiled in place with torch.compile for inference (answer, evaluate, serve).

The encoder is the part worth compiling: its layers are what Inductor fuses (the attention kernels' elementwise work,
LayerNorm, GELU); the task heads decode a few candidates. `nn.Module.compile` compiles the module's call in place, so
the model keeps its class, config and state-dict keys (a compiled model still saves as a plain one).
The layers of every preset compile to one graph (tests/test_compile_graph.py, fullgraph); BigBird's per-row plan,
which reads each row's real length, is made in the graph (`dispatch.PlanInGraph`): by default inside one opaque op
per layer that reads the rows' lengths, or on the device with no host read (LONGBIRD_ROW_PLAN=device). The model's
input checks read token-type and position values (a clear error instead of an index error), so with those inputs
given the call compiles with a break before the layers: compiled without `fullgraph`.
The first call of each input shape compiles (seconds to minutes); later shapes are compiled with dynamic shapes.
"""

from __future__ import annotations

import torch


def compile_encoder(model: torch.nn.Module, mode: str | None = None) -> torch.nn.Module:
    """`model` with its longbird encoder (`model.base_model`) compiled in place; returns the model."""
    encoder = model.base_model
    encoder.compile(mode=mode)
    return model


def encoder_is_compiled(model: torch.nn.Module) -> bool:
    """`model`'s longbird encoder was compiled in place (`compile_encoder`, or `nn.Module.compile` on it): its first
    calls of each kind of input compile."""
    encoder = getattr(model, "base_model", None)  # stand-ins for a model in tests have none: not compiled
    return getattr(encoder, "_compiled_call_impl", None) is not None


def batch_multiple(model: torch.nn.Module) -> int | None:
    """What a compiled encoder's batches are padded to a multiple of (`PaddedBatches(multiple=...)`), else None.

    Why: the encoder right-pads a batch to its block size's multiple when the batch is not one already
    (`modeling.py`), and with dynamic shapes torch.compile guards on that branch. Serving then compiled the same
    graph again for the first batch of the other kind, a length that is a multiple of the block or one that is not:
    a 7.3-second request after the warm-up (docs/serve.md). A batch that arrives already padded (masked keys, rows
    the decoding never reads) always takes the same side of the branch."""
    if not encoder_is_compiled(model):
        return None
    return getattr(model.config, "block_size", None)
