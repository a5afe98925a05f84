"""`--compile`: a loaded model's encoder compiled in place with torch.compile for inference (answer, evaluate, serve).

The encoder is the part worth compiling: its layers are what Inductor fuses (the attention kernels' elementwise work,
LayerNorm, GELU); the task heads decode a few candidates. `nn.Module.compile` compiles the module's call in place, so
the model keeps its class, config and state-dict keys (a compiled model still saves as a plain one).
LittleBird, full attention and TAPE compile to one graph (`fullgraph=True`, tested: tests/test_export_compile.py);
BigBird's per-row plan reads each row's real length on the host (attention/rows.py), so kobigbird compiles with a
graph break there and its layers run as compiled graphs between the plan's decisions.
The first call of each input shape compiles (seconds to minutes); later shapes are compiled with dynamic shapes.
"""

from __future__ import annotations

import torch


def one_graph(config) -> bool:
    """Whether the encoder of `config` compiles without a graph break (every preset but BigBird's per-row plan)."""
    return config.attention != "bigbird"


def compile_encoder(model: torch.nn.Module, mode: str | None = None) -> torch.nn.Module:
    """`model` with its longbird encoder (`model.base_model`) compiled in place; returns the model."""
    encoder = model.base_model
    encoder.compile(fullgraph=one_graph(encoder.config), mode=mode)
    return model
