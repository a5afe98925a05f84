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

On the CPU an encoder whose Linear weights are bf16 (`--bf16`) is compiled with Inductor's *freezing*
(`frozen_calls`): for a call without autograd the weights become constants of the graph, so each Linear's weight is
packed once into oneDNN's own layout and GELU or the bias add runs as the product's epilogue
(`mkldnn::_linear_pointwise`) instead of as a kernel of its own: 6-14 % faster than the plain compile. An fp32
encoder is compiled without it: frozen, its linears become MKL's packed `mkl::_mkl_linear`, which ran 0.3-8 % slower
than the plain compile in every fp32 cell measured, alternating in one process (`benchmarks/compile_freezing.py`;
docs/benchmarks.md, "Freezing only in bf16"). A frozen graph holds the weights of the moment it compiled: this is
an inference compile (the weights of a model being trained are compiled by Trainer's `torch_compile`, never here).
"""

from __future__ import annotations

import functools

import torch


def freezing_pays(encoder: torch.nn.Module) -> bool:
    """Whether `compile_encoder` freezes by default: an encoder on the CPU whose Linear weights are bf16 (the module
    docstring says why not fp32)."""
    weight = next((module.weight for module in encoder.modules() if isinstance(module, torch.nn.Linear)), None)
    return weight is not None and weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def compile_encoder(model: torch.nn.Module, mode: str | None = None, freeze: bool | None = None) -> torch.nn.Module:
    """`model` with its longbird encoder (`model.base_model`) compiled in place; returns the model. `freeze` (default:
    `freezing_pays`, i.e. on the CPU with bf16 Linear weights): its calls without autograd compile with Inductor's
    freezing (`frozen_calls`)."""
    encoder = model.base_model
    encoder.compile(mode=mode)
    if freeze is None:
        freeze = freezing_pays(encoder)
    if freeze:
        encoder._compiled_call_impl = frozen_calls(encoder._compiled_call_impl)
    return model


def frozen_calls(compiled):
    """`compiled` (a torch.compile'd callable) compiling, and recompiling for new shapes, with Inductor's freezing.

    Why around every call and not `torch.compile(options={"freezing": True})`: Dynamo reads the setting while it
    traces, to keep the parameters as attributes of the graph rather than inputs, and the options reach only
    Inductor, after the trace: with them the linears stayed `aten::addmm` on unpacked weights (torch 2.13, measured);
    with the setting on during the call they became `mkldnn::_linear_pointwise` (docs/benchmarks.md, "Frozen
    weights"). Freezing applies only where autograd is off (Inductor's own rule), so a call with gradients compiles
    as before."""
    @functools.wraps(compiled)
    def call(*args, **kwargs):
        with torch._inductor.config.patch(freezing=True):
            return compiled(*args, **kwargs)
    call.frozen = True
    return call


def encoder_is_compiled(model: torch.nn.Module) -> bool:
    """`model`'s longbird encoder was compiled in place (`compile_encoder`, or `nn.Module.compile` on it): its first
    calls of each kind of input compile."""
    encoder = getattr(model, "base_model", None)  # stand-ins for a model in tests have none: not compiled
    return getattr(encoder, "_compiled_call_impl", None) is not None


def encoder_is_frozen(model: torch.nn.Module) -> bool:
    """`model`'s encoder was compiled with freezing (`compile_encoder` on the CPU in bf16)."""
    encoder = getattr(model, "base_model", None)
    return getattr(getattr(encoder, "_compiled_call_impl", None), "frozen", False)


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
