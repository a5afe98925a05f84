"""Issue 10 item 5: what training keeps for backward, and that keeping less changes no gradient.

Whenever autograd records (and the layer is not already checkpointed or traced), the feed-forward activation
act(W1 A) is saved as a reference to its input and recomputed in backward (layers._ActivationSavedAsInput), in
every preset. Setting a layer's `gradient_checkpointing` flag without checkpointing the encoder switches it off:
that is the comparison below. The memory it saves is measured by `longbird bench` (benchmarks/results), not here.
"""

from __future__ import annotations

import pytest
import torch

import longbird
import longbird.layers as layers
from conftest import BLOCK, make_batch, make_source


def _model(preset, dropout=0.0):
    overrides = dict(block_size=BLOCK, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    if preset == "littlebird":
        overrides["pack_size"] = 4
    model = longbird.convert(make_source("bert"), preset=preset, max_length=512, **overrides)
    return model.train()


def _gradients(model, input_ids, attention_mask, savings: bool, autocast=False, seed=0):
    for layer in model.encoder.layer:
        layer.gradient_checkpointing = not savings  # the flag only: the encoder itself is not checkpointed
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    probe = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(1))
    (out[attention_mask.bool()].float() @ probe).sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("preset", ["kobigbird", "littlebird", "full"])
@pytest.mark.parametrize("autocast", [False, True])
def test_recomputing_activations_changes_no_gradient(preset, autocast):
    model = _model(preset)
    batch = make_batch(3 * 64 + 5)  # above the source length: sparse kernels, one padded row
    out, with_savings = _gradients(model, *batch, savings=True, autocast=autocast)
    reference_out, without = _gradients(model, *batch, savings=False, autocast=autocast)
    torch.testing.assert_close(out, reference_out, atol=0, rtol=0)
    assert with_savings.keys() == without.keys() and len(with_savings) > 10
    for name, grad in with_savings.items():  # recomputation repeats the same operations on the same inputs
        torch.testing.assert_close(grad, without[name], atol=1e-6, rtol=1e-5, msg=name)


def test_recomputed_activations_with_dropout_on():
    """Attention and hidden dropout on (LittleBird, pack tokens): the recomputed activation sits between no dropout
    masks, so with the same seed the gradients equal those of the run that kept everything."""
    model = _model("littlebird", dropout=0.1)
    batch = make_batch(2 * 64 + 9)
    out, with_savings = _gradients(model, *batch, savings=True, seed=7)
    reference_out, without = _gradients(model, *batch, savings=False, seed=7)
    torch.testing.assert_close(out, reference_out, atol=0, rtol=0)
    for name, grad in with_savings.items():
        torch.testing.assert_close(grad, without[name], atol=1e-6, rtol=1e-5, msg=name)


def test_the_activation_output_is_not_kept(monkeypatch):
    """Every layer's W2 input (act(W1 A)) is packed as a recompute recipe, never as the tensor."""
    packed = []
    pack = layers._ActivationSavedAsInput.pack
    monkeypatch.setattr(layers._ActivationSavedAsInput, "pack",
                        lambda self, tensor: packed.append(result := pack(self, tensor)) or result)
    model = _model("littlebird")
    intermediate = model.config.intermediate_size
    model(*make_batch(100)).last_hidden_state.sum().backward()
    recipes = [item for item in packed if isinstance(item, tuple)]
    assert len(recipes) == model.config.num_hidden_layers
    assert all(recipe[1][-1] == intermediate for recipe in recipes)
    assert not any(isinstance(item, torch.Tensor) and item.shape[-1] == intermediate and item.grad_fn is not None
                   and item.grad_fn.name().startswith("Gelu") for item in packed)
