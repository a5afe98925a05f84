"""Training through torch.compile (issue 27, item 3; what `finetune-* --compile` relies on): a fullgraph-compiled
step gives the eager loss and gradients for every preset. Apart from test_compile_reading.py so that the two files'
compilations, the slowest of the suite with a cold Inductor cache, run on different pytest-xdist workers."""

from __future__ import annotations

import pytest
import torch

import longbird
from conftest import BLOCK, make_batch, make_source


def _without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0
    return model


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "tape"])
def test_compiled_training_step_gives_the_eager_gradients(preset):
    """What `finetune-* --compile` relies on (Trainer's torch_compile): forward and backward through Inductor, as one
    graph, give the eager loss and gradients, the hand-written LittleBird backward and BigBird's per-row plan (an op
    whose backward recomputes the layer's attention) included."""
    torch.manual_seed(0)
    model = _without_dropout(longbird.convert(make_source("bert"), preset=preset, max_length=256,
                                              block_size=BLOCK).train())
    input_ids, attention_mask = make_batch(200, batch=2)  # sparse for kobigbird, a padded row
    real = attention_mask.bool()

    def step(run):
        model.zero_grad(set_to_none=True)
        out = run(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        loss = (out[real] ** 2).mean()
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager = step(model)
    compiled_loss, compiled = step(torch.compile(model, fullgraph=True))
    assert compiled_loss == pytest.approx(eager_loss.item(), rel=1e-5)
    scale = max(grad.abs().max().item() for grad in eager.values())
    for name, grad in eager.items():
        # fp32 sums reordered by Inductor: errors ~ the gradient scale x 1e-6; 1e-5 of the largest gradient bounds them
        # (a gradient that is exactly 0 in theory, such as a key bias under softmax, is rounding noise in both)
        assert (compiled[name] - grad).abs().max().item() <= 1e-5 * scale + 1e-4 * grad.abs().max().item(), name
