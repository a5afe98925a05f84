"""Attention dropout is honoured: applied by the blocked and SDPA kernels in training, off in eval, and flex (which
cannot apply it) is never chosen for such a call."""

import pytest
import torch

import longbird
from longbird.attention import usw_attention, usw_layout
from longbird.dispatch import choose_backend
from longbird.positions.alibi import BiALiBi
from conftest import BLOCK, make_batch, make_source

PRESETS = {"kobigbird-sparse": dict(preset="kobigbird", num_random_blocks=2, full_attention_max_length=8),
           "kobigbird-full": dict(preset="kobigbird"), "littlebird": dict(preset="littlebird", pack_size=4)}


def _model(name, p):
    return longbird.convert(make_source("bert"), max_length=512, block_size=BLOCK, attention_probs_dropout_prob=p,
                            **PRESETS[name])


@pytest.mark.parametrize("name", list(PRESETS))
def test_dropout_in_training_only(name):
    model, plain = _model(name, 0.3), _model(name, 0.0)
    assert model.config.attention_probs_dropout_prob == 0.3
    input_ids, attention_mask = make_batch(40)
    run = lambda m: m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(run(model.eval()), run(plain.eval()), rtol=0, atol=0)  # eval: no dropout
        model.train()  # hidden dropout is 0 in the tiny sources: only attention dropout is random
        torch.manual_seed(1)
        first = run(model)
        torch.manual_seed(1)
        again = run(model)
        torch.manual_seed(2)
        other = run(model)
    real = attention_mask.bool()
    torch.testing.assert_close(first, again, rtol=0, atol=0)  # reproducible under a seed
    assert (first - other)[real].abs().max() > 1e-3  # and really random
    assert (first - run(plain.eval()).detach())[real].abs().max() > 1e-3


def test_usw_kernel_dropout_is_unbiased():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 32, 8, generator=generator) for _ in range(3))
    key_mask = torch.ones(1, 32, dtype=torch.bool)
    bias = BiALiBi(2)
    layout = usw_layout(key_mask, torch.arange(32)[None], BLOCK, bias)
    exact = usw_attention(q, k, v, layout, bias)
    torch.manual_seed(0)
    samples = torch.stack([usw_attention(q, k, v, layout, bias, dropout_p=0.5) for _ in range(600)])
    assert (samples[0] - exact).abs().max() > 0.1
    # inverted dropout keeps the expectation: every element's mean of 600 independent draws lies within 5 standard
    # errors of the exact output (a normal tail of 6e-7 per element, about 3e-4 over the 512 elements); a scaling off
    # by 10 % (e.g. 1/(1-p) applied twice over a smaller p) moves the mean by 0.1 |exact|, many standard errors here
    standard_error = samples.std(0) / len(samples) ** 0.5
    assert ((samples.mean(0) - exact).abs() <= 5 * standard_error).all()
    assert ((samples.mean(0) * 1.1 - exact).abs() > 5 * standard_error).any()


def test_flex_is_never_chosen_for_a_call_with_attention_dropout(monkeypatch):
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")  # without it LittleBird's fp32 inference takes the fused kernel
    cpu = torch.device("cpu")
    with torch.no_grad():
        assert choose_backend("auto", cpu, 8192, 64, kernel="usw").name == "flex"
        chosen = choose_backend("auto", cpu, 8192, 64, attention_dropout=True, kernel="usw")
        assert chosen.name == "blocked" and "attention dropout" in chosen.reason
        with pytest.raises(ValueError, match="flex_attention cannot apply it"):
            choose_backend("flex", cpu, 8192, 64, attention_dropout=True)
