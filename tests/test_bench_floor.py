"""The GEMM floor benchmark (longbird.bench.floor): it replays exactly the model's own dense products."""

import pytest
import torch

from longbird.bench.floor import floor_measurement, op_profile, record_linear_calls, replay_fn
from longbird.bench.models import SIZES, build_model, forward_fn, linear_flops


@pytest.mark.parametrize("preset", ["full", "kobigbird", "littlebird", "tape"])
def test_the_recorded_calls_are_the_models_projections_and_feed_forward(preset):
    size = SIZES["smoke"]
    model = build_model(preset, 256, size)
    calls = record_linear_calls(model, forward_fn(model, 256, backward=False, base=size))
    layers = size["num_hidden_layers"]
    # every layer: query, key, value, attention output, FFN in, FFN out (LittleBird adds its pack attention's maps)
    assert len(calls) >= 6 * layers
    projections = [call for call in calls if call.input_shape[-2] == 256]
    assert sum(call.flops for call in projections) >= linear_flops(256, size)
    if preset in ("full", "kobigbird"):  # nothing but the six maps per layer, and the pooler on [CLS]
        assert len(projections) == 6 * layers
        assert sum(call.flops for call in projections) == linear_flops(256, size)
        assert [call.input_shape for call in calls if call.input_shape[-2] != 256] == [(1, size["hidden_size"])]
    # the hooks are gone afterwards
    assert not any(module._forward_pre_hooks for module in model.modules())


def test_the_replay_computes_the_same_products():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4, bias=False))
    seen = []
    original = torch.nn.functional.linear

    def counting(x, weight, bias=None):
        seen.append((tuple(x.shape), weight.data_ptr(), None if bias is None else bias.data_ptr()))
        return original(x, weight, bias)

    x = torch.randn(3, 5, 8)
    calls = record_linear_calls(model, lambda: model(x))
    assert [(call.input_shape, call.weight.shape) for call in calls] == [((3, 5, 8), (16, 8)), ((3, 5, 16), (4, 16))]
    torch.nn.functional.linear = counting
    try:
        replay_fn(calls)()
    finally:
        torch.nn.functional.linear = original
    assert seen == [((3, 5, 8), model[0].weight.data_ptr(), model[0].bias.data_ptr()),
                    ((3, 5, 16), model[2].weight.data_ptr(), None)]


def test_a_measurement_reports_forward_floor_and_profile():
    size = SIZES["smoke"]
    model = build_model("kobigbird", 256, size)
    run = forward_fn(model, 256, backward=False, base=size)
    row = floor_measurement(model, run, repeats=1)
    assert row["linear_calls"] == 6 * size["num_hidden_layers"] + 1  # and the pooler
    assert row["forward_seconds"] > 0 and row["floor_seconds"] > 0
    assert row["ratio"] == pytest.approx(row["forward_seconds"] / row["floor_seconds"])
    ops = op_profile(run, top=5)
    assert 1 <= len(ops) <= 5
    assert all(0 < op["share"] <= 1 for op in ops) and sum(op["share"] for op in ops) <= 1 + 1e-9
    assert ops == sorted(ops, key=lambda op: op["self_ms"], reverse=True)


def test_variants_are_timed_alternately_with_their_first_call_apart():
    size = SIZES["smoke"]
    model = build_model("littlebird", 128, size)
    run = forward_fn(model, 128, backward=False, base=size)
    calls = []

    def variant():
        calls.append(1)
        return run()

    row = floor_measurement(model, run, repeats=2, variants={"compiled": variant})
    assert len(calls) == 1 + 2  # the first call (compilation) apart, then once per repeat
    assert len(row["compiled_samples"]) == 2 and row["compiled_first_call_seconds"] > 0
    assert row["compiled_ratio"] == pytest.approx(row["compiled_seconds"] / row["floor_seconds"])
