"""LittleBird: USW + pack kernels vs dense oracle, sparsity, padding and Padding-Insertion invariance, BiALiBi."""

import copy

import pytest
import torch

import longbird
from longbird.attention import pack_attention, reference_attention, usw_attention, usw_attention_reference, usw_layout
from longbird.positions.alibi import BiALiBi
from conftest import AWKWARD_LENGTHS, BLOCK, SOURCE_LENGTH, assert_same_outputs_and_gradients, make_batch, make_source


def _bias(heads=4):
    bias = BiALiBi(heads)
    with torch.no_grad():  # distinct α, β, γ so a mix-up between them shows
        bias.alpha.mul_(3.0)
        bias.gamma.mul_(0.5)
    return bias


@pytest.mark.parametrize("length", [8, 16, 64, 72, 120, 256])
@pytest.mark.parametrize("pack", [0, 4])
def test_usw_kernel_equals_dense_reference(length, pack):
    generator = torch.Generator().manual_seed(length + pack)
    q, k, v = (torch.randn(2, 4, length, 8, generator=generator).requires_grad_() for _ in range(3))
    pk, pv = (torch.randn(2, 4, pack, 8, generator=generator).requires_grad_() for _ in range(2))
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, length - 5:] = False
    positions = torch.arange(length).expand(2, -1).clone()
    positions[1, 3:] += 11  # a Padding-Insertion gap
    bias = _bias()
    packed = (pk, pv) if pack else (None, None)
    out = usw_attention(q, k, v, usw_layout(key_mask, positions, BLOCK, bias), bias, *packed)
    ref = usw_attention_reference(q, k, v, key_mask, positions, bias, BLOCK, *packed)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    params = [q, k, v, bias.alpha, bias.beta, bias.gamma] + ([pk, pv] if pack else [])
    grad_out = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad(out, params, grad_out), torch.autograd.grad(ref, params, grad_out)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _usw_inputs(length, pack, dtype, token_major, seed):
    """q, k, v (2, 4, length, 8) and pack keys/values, a padded second row and a Padding-Insertion gap; token-major
    inputs are laid out (B, l, H, d) as the model's projections make them, the others (B, H, l, d)."""
    generator = torch.Generator().manual_seed(seed)
    def tensor(tokens):
        x = torch.randn(2, tokens, 4, 8, generator=generator, dtype=torch.float64).to(dtype)
        return x.transpose(1, 2) if token_major else x.transpose(1, 2).contiguous()
    q, k, v = (tensor(length) for _ in range(3))
    pk, pv = (tensor(pack) for _ in range(2)) if pack else (None, None)
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, length - 5:] = False
    positions = torch.arange(length).expand(2, -1).clone()
    positions[1, 3:] += 11
    return q, k, v, pk, pv, key_mask, positions


def _count_split_calls(monkeypatch) -> list:
    import longbird.attention.littlebird as littlebird

    calls = []
    split = littlebird.usw_split_attention
    monkeypatch.setattr(littlebird, "usw_split_attention", lambda *a, **k: calls.append(1) or split(*a, **k))
    return calls


@pytest.mark.parametrize("length", [8, 16, 64, 72, 256])
@pytest.mark.parametrize("pack", [0, 4])
@pytest.mark.parametrize("token_major", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_usw_inference_kernel_without_key_groups_equals_dense_reference(length, pack, token_major, dtype,
                                                                        monkeypatch):
    """At CPU inference the USW softmax runs as two flash-attention calls merged by their log-sum-exps, the window
    keys read in place through overlapping views of a padded copy. Equal to the dense oracle within the fp32 rounding
    both share (the oracle's bias terms are fp32), and unchanged when a later call (other inputs) reuses the scratch
    buffers: the output never aliases them."""
    calls = _count_split_calls(monkeypatch)
    bias = _bias()
    workspace, outputs = {}, []
    for seed in (length + pack, length + pack + 1):
        q, k, v, pk, pv, key_mask, positions = _usw_inputs(length, pack, dtype, token_major, seed)
        with torch.no_grad():
            out = usw_attention(q, k, v, usw_layout(key_mask, positions, BLOCK, bias), bias, pk, pv, workspace)
            ref = usw_attention_reference(q, k, v, key_mask, positions, bias, BLOCK, pk, pv)
        real = key_mask[:, None, :, None]  # padding query rows attend to masked keys only: undefined, never read
        torch.testing.assert_close(out * real, ref * real, atol=2e-6, rtol=1e-5)
        outputs.append((out, out.clone()))
    assert len(calls) == 2 and workspace  # the split kernel ran, through the reused buffers
    assert torch.equal(*outputs[0])  # the first output, after the second call wrote the same buffers


def test_usw_inference_kernel_keeps_batch_rows_apart_even_with_non_finite_padding(monkeypatch):
    """A row's windows never reach into another row's keys: an infinite key and value in row 0's padding (fp16
    overflow, say) leave row 1's outputs exactly what they are when row 1 is read alone (0 · inf would be NaN)."""
    calls = _count_split_calls(monkeypatch)
    bias = _bias()
    q, k, v, pk, pv, key_mask, positions = _usw_inputs(64, 4, torch.float32, True, 0)
    key_mask[0, 56:] = False
    k[0, :, 60], v[0, :, 60] = float("inf"), float("inf")
    with torch.no_grad():
        both = usw_attention(q, k, v, usw_layout(key_mask, positions, BLOCK, bias), bias, pk, pv)
        alone = usw_attention(q[1:], k[1:], v[1:], usw_layout(key_mask[1:], positions[1:], BLOCK, bias), bias,
                              pk[1:], pv[1:])
    real = key_mask[1][None, :, None]
    assert len(calls) == 2 and torch.isfinite(both[1] * real).all()
    torch.testing.assert_close(both[1] * real, alone[0] * real, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pack", [0, 4])
def test_usw_inference_kernel_in_half_precision_stays_within_its_roundings_of_the_grouped_kernel(dtype, pack,
                                                                                                 monkeypatch):
    """bf16/fp16 with unit roundoff u (2^-8, 2^-11): both kernels round the probabilities before P·V and their output
    (u·max|v| each); the split kernel also rounds its two partial outputs (the merge itself runs in fp32). So the two
    differ by at most (2 + 3)·u·max|v|."""
    import longbird.attention.littlebird as littlebird

    calls = _count_split_calls(monkeypatch)
    bias = _bias()
    q, k, v, pk, pv, key_mask, positions = _usw_inputs(256, pack, dtype, True, pack)
    layout = usw_layout(key_mask, positions, BLOCK, bias)
    with torch.no_grad():
        split = usw_attention(q, k, v, layout, bias, pk, pv)
        monkeypatch.setattr(littlebird, "split_kernel_applies", lambda *a: False)
        grouped = usw_attention(q, k, v, layout, bias, pk, pv)
    unit = torch.finfo(dtype).eps / 2  # round to nearest
    scale = max(v.abs().max(), pv.abs().max() if pack else 0).float()
    real = key_mask[:, None, :, None]
    difference = ((split.float() - grouped.float()) * real).abs().max()
    assert len(calls) == 1 and split.dtype == dtype and difference <= 5 * unit * scale


def test_grouped_usw_inference_takes_any_sdpa_output_layout_and_wider_values(monkeypatch):
    """On an H100, SDPA returned the grouped kernel's (B, H·n, b, d_v) output in another memory layout when the values
    are wider than the keys (TAPE), and a `.view` of it failed. Here SDPA's result is handed back non-contiguous
    ((B, b, H·n, d_v) in memory), values wider than keys: the output still equals the dense oracle."""
    import torch.nn.functional as F

    import longbird.attention.littlebird as littlebird
    import longbird.attention.usw_inference as usw_inference

    sdpa = F.scaled_dot_product_attention

    def sdpa_with_another_layout(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(usw_inference.F, "scaled_dot_product_attention", sdpa_with_another_layout)
    monkeypatch.setattr(littlebird, "split_kernel_applies", lambda *a: False)  # the grouped kernel
    bias = _bias()
    q, k, _, pk, _, key_mask, positions = _usw_inputs(64, 4, torch.float32, False, 7)
    generator = torch.Generator().manual_seed(8)
    v, pv = torch.randn(2, 4, 64, 12, generator=generator), torch.randn(2, 4, 4, 12, generator=generator)
    with torch.no_grad():
        out = usw_attention(q, k, v, usw_layout(key_mask, positions, BLOCK, bias), bias, pk, pv)
        ref = usw_attention_reference(q, k, v, key_mask, positions, bias, BLOCK, pk, pv)
    real = key_mask[:, None, :, None]
    assert out.shape == (2, 4, 64, 12)
    torch.testing.assert_close(out * real, ref * real, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("pack", [0, 4])
@pytest.mark.parametrize("heads_at_a_time", ["all", "one"])
def test_usw_hand_written_backward_passes_gradcheck(pack, heads_at_a_time, monkeypatch):
    """The custom backward (attention/littlebird.py, _USWAttention) against finite differences in float64, with a padded
    row, a Padding-Insertion gap and pack tokens: every input, the three slopes and the pack distance; with all heads
    in one chunk and one head per chunk (`_head_chunks`, as at long lengths)."""
    if heads_at_a_time == "one":
        monkeypatch.setattr("longbird.attention.littlebird._CHUNK_ELEMENTS", 1)
    generator = torch.Generator().manual_seed(pack)
    length = 40
    q, k, v = (torch.randn(2, 2, length, 4, generator=generator, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    pk, pv = (torch.randn(2, 2, pack, 4, generator=generator, dtype=torch.float64).requires_grad_() for _ in range(2))
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, length - 5:] = False
    positions = torch.arange(length).expand(2, -1).clone()
    positions[1, 3:] += 11
    bias = _bias(heads=2).double()
    layout = usw_layout(key_mask, positions, BLOCK, bias)
    packed = (pk, pv) if pack else (None, None)

    def run(*inputs):
        q, k, v, alpha, beta, gamma, *pk_pv = inputs
        slopes = type("Slopes", (), {"alpha": alpha, "beta": beta, "gamma": gamma,
                                     "pack_distance": lambda self, b: (beta + gamma) / 2 * b})()
        out = usw_attention(q, k, v, layout, slopes, *(pk_pv or packed))
        return out[key_mask[:, None, :, None].expand_as(out)]  # real query rows

    inputs = (q, k, v, bias.alpha, bias.beta, bias.gamma) + ((pk, pv) if pack else ())
    assert torch.autograd.gradcheck(run, inputs, eps=1e-6, atol=1e-6)


def test_usw_bf16_backward_stays_close_to_fp32():
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 128, 16, generator=generator) for _ in range(3))
    pk, pv = (torch.randn(2, 4, 8, 16, generator=generator) for _ in range(2))
    key_mask = torch.ones(2, 128, dtype=torch.bool)
    key_mask[1, 100:] = False
    bias = _bias()
    layout = usw_layout(key_mask, torch.arange(128).expand(2, -1), BLOCK, bias)
    grad_out = torch.randn(2, 4, 128, 16, generator=generator)
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        inputs = [x.to(dtype).requires_grad_() for x in (q, k, v, pk, pv)]
        out = usw_attention(*inputs[:3], layout, bias, *inputs[3:])
        assert out.dtype == dtype
        grads[dtype] = torch.autograd.grad(out, inputs, grad_out.to(dtype))
    for low, high in zip(grads[torch.bfloat16], grads[torch.float32]):
        cosine = torch.nn.functional.cosine_similarity(low.float().flatten(), high.flatten(), dim=0)
        assert low.dtype == torch.bfloat16 and cosine > 0.99


def test_pack_kernel_equals_dense_reference():
    generator = torch.Generator().manual_seed(0)
    pq = torch.randn(2, 4, 4, 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, 4, 65, 8, generator=generator, requires_grad=True) for _ in range(2))
    key_mask = torch.ones(2, 65, dtype=torch.bool)
    key_mask[1, 40:] = False
    out = pack_attention(pq, k, v, key_mask)
    ref = reference_attention(pq, k, v, key_mask[:, None, None, :])
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    for got, want in zip(torch.autograd.grad(out.sum(), (pq, k, v)), torch.autograd.grad(ref.sum(), (pq, k, v))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def _littlebird(name="bert", pack_size=4, **overrides):
    overrides = {"block_size": BLOCK, **overrides}
    return longbird.convert(make_source(name), preset="littlebird", max_length=512, pack_size=pack_size, **overrides)


def _with_reference(model):
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "reference"
    return reference


@pytest.mark.parametrize("length", AWKWARD_LENGTHS)
@pytest.mark.parametrize("pack_size", [0, 4])
def test_model_equals_reference_implementation(length, pack_size):
    model = _littlebird(pack_size=pack_size)
    reference = _with_reference(model)
    assert_same_outputs_and_gradients(model, reference, *make_batch(length))


def test_sparsity_gradient_zero_outside_window_and_first_block():
    from transformers import BertConfig, BertModel

    from conftest import _SIZES

    torch.manual_seed(0)
    source = BertModel(BertConfig(**{**_SIZES, "num_hidden_layers": 1}, max_position_embeddings=SOURCE_LENGTH))
    model = longbird.convert(source, preset="littlebird", max_length=512, block_size=BLOCK, pack_size=0)
    length = 6 * BLOCK
    embeds = torch.randn(1, length, 32, requires_grad=True)
    out = model(inputs_embeds=embeds).last_hidden_state
    block = torch.arange(length) // BLOCK
    probe = torch.randn(32)  # a plain sum of a LayerNorm output is constant: project instead
    for i in (3, 20, 40):
        (grad,) = torch.autograd.grad(out[0, i] @ probe, embeds, retain_graph=True)
        touched = grad[0].abs().sum(-1) > 0
        allowed = ((block - block[i]).abs() <= 1) | (block == 0)
        assert not touched[~allowed].any(), f"query {i} sees keys outside its window"
        assert touched[allowed].all(), f"query {i} misses keys inside its window"


@pytest.mark.parametrize("length", [65, 113])
def test_padding_never_changes_real_tokens_even_across_blocks(length):
    model = _littlebird()
    input_ids, _ = make_batch(length, batch=1, padded_rows=0)
    with torch.no_grad():
        alone = model(input_ids=input_ids).last_hidden_state
        extra = 37  # adds blocks: LittleBird has no last global block, so nothing may change
        padded = model(input_ids=torch.cat([input_ids, torch.full((1, extra), 7)], 1),
                       attention_mask=torch.cat([torch.ones(1, length), torch.zeros(1, extra)], 1).long()
                       ).last_hidden_state
    torch.testing.assert_close(padded[:, :length], alone, atol=1e-5, rtol=1e-5)


def test_position_gap_equals_inserted_masked_padding():
    # Two blocks of 16 hold everything before and after, so blocking cannot differ between the two inputs.
    model = longbird.convert(make_source("bert"), preset="littlebird", max_length=512, block_size=16, pack_size=4)
    input_ids, _ = make_batch(20, batch=1, padded_rows=0)
    cut, gap = 9, 6
    with torch.no_grad():
        positions = torch.arange(20)[None].clone()
        positions[:, cut:] += gap
        with_gap = model(input_ids=input_ids, position_ids=positions).last_hidden_state
        padded_ids = torch.cat([input_ids[:, :cut], torch.full((1, gap), 7), input_ids[:, cut:]], 1)
        mask = torch.ones(1, 20 + gap, dtype=torch.long)
        mask[:, cut: cut + gap] = 0
        inserted = model(input_ids=padded_ids, attention_mask=mask).last_hidden_state
    keep = mask[0].bool()
    torch.testing.assert_close(inserted[:, keep], with_gap, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the gap does change the outputs (the test can fail)
        no_gap = model(input_ids=input_ids).last_hidden_state
    assert (no_gap - with_gap).abs().max() > 1e-3


def test_bialibi_matches_hand_written_5x5():
    bias = BiALiBi(1)
    with torch.no_grad():
        bias.alpha.fill_(10.0)
        bias.beta.fill_(1.0)
        bias.gamma.fill_(2.0)
    # rows = query position, columns = key position; left keys β·distance, right keys γ·distance, [CLS] α.
    expected = torch.tensor([
        [0., 10., 10., 10., 10.],
        [10., 0., 2., 4., 6.],
        [10., 1., 0., 2., 4.],
        [10., 2., 1., 0., 2.],
        [10., 3., 2., 1., 0.],
    ])
    torch.testing.assert_close(bias.distance(torch.arange(5), torch.arange(5))[0], expected)
    # Positions, not indices: a gap of 3 after index 2 stretches distances across it only.
    stretched = bias.distance(torch.tensor([0, 1, 2, 6, 7]), torch.tensor([0, 1, 2, 6, 7]))[0]
    assert stretched[4, 2] == 5.0 and stretched[2, 4] == 10.0 and stretched[4, 3] == 1.0
    torch.testing.assert_close(bias.pack_distance(8), torch.tensor([(1.0 + 2.0) / 2 * 8]))


def test_save_load_round_trip(tmp_path):
    model = _littlebird("roberta-mlm")
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForMaskedLM

    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    for (key, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), key
    input_ids, attention_mask = make_batch(100, pad_id=1)
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids, attention_mask=attention_mask).logits,
                           loaded(input_ids=input_ids, attention_mask=attention_mask).logits)


def test_conversion_reuses_source_weights_and_runs_at_four_times_L(source_name):
    source = make_source(source_name)
    model = longbird.convert(source, preset="littlebird", max_length=512, block_size=BLOCK, pack_size=4).train()
    base = getattr(model, "longbird", model)
    assert base.embeddings.position_embeddings is None  # BiALiBi replaces the absolute table
    layer, source_layer = base.encoder.layer[0], source.base_model.encoder.layer[0]
    for ours in (layer.attention.self.query, layer.pack_attention.self.query):
        assert torch.equal(ours.weight, source_layer.attention.self.query.weight)
    input_ids, attention_mask = make_batch(4 * SOURCE_LENGTH, pad_id=source.config.pad_token_id)
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.logits if hasattr(out, "logits") else out.last_hidden_state
    assert torch.isfinite(hidden).all()
    hidden.float().pow(2).mean().backward()
    assert layer.bialibi.beta.grad is not None and layer.bialibi.beta.grad.abs().sum() > 0
    assert base.encoder.pack_embeddings.grad.abs().sum() > 0


def test_bad_littlebird_settings_raise_clear_errors():
    with pytest.raises(ValueError, match=r"pack_size \(600\) must lie in 0..max_length \(512\)"):
        _littlebird(pack_size=600)
    with pytest.raises(ValueError, match=r"max_length \(512\) must be a multiple of block_size \(48\)"):
        _littlebird(block_size=48)
    with pytest.raises(ValueError, match="littlebird takes position 'bialibi' or 'tape'"):
        longbird.convert(make_source("bert"), preset="littlebird", max_length=512, block_size=BLOCK, position="absolute")
    with pytest.raises(ValueError, match=r"input length 513 exceeds max_position_embeddings \(512\)"):
        _littlebird()(input_ids=torch.ones(1, 513, dtype=torch.long))


@pytest.mark.parametrize("mode", ["pure-bf16", "autocast"])
def test_bf16_close_to_fp32(mode):
    model = _littlebird()
    input_ids, attention_mask = make_batch(113)
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if mode == "pure-bf16":
            out = model.to(torch.bfloat16)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    assert torch.nn.functional.cosine_similarity(out.float()[real], reference[real], dim=-1).min() > 0.99


def test_paper_parameter_layout_shares_the_output_projection():
    """§3.4: pack attention has its own Q/K/V and shares unpack attention's output projection. A RoBERTa-base-sized
    conversion then has the paper's English base size, 145.6M (three extra h x h matrices per layer)."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    source = RobertaModel(RobertaConfig(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1))
    model = longbird.convert(source, preset="littlebird", max_length=4096)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - 145.6e6) <= 0.005 * 145.6e6, count
    separate = longbird.convert(source, preset="littlebird", max_length=4096, pack_output_projection="separate")
    assert sum(p.numel() for p in separate.parameters()) - count == 12 * (768 * 768 + 768)
    layer = model.encoder.layer[0]
    assert layer.pack_attention.output.dense is None
    assert torch.equal(layer.pack_attention.self.key.weight, source.encoder.layer[0].attention.self.key.weight)
    with pytest.raises(ValueError, match="pack_output_projection must be 'shared' or 'separate'"):
        _littlebird(pack_output_projection="both")


def test_shared_projection_is_the_separate_one_tied():
    """Shared = separate with the two output projections tied: equal outputs (both start as the source's W_O), and
    the shared gradient is the sum of the separate model's unpack and pack projection gradients."""
    shared = _littlebird(pack_size=4).train()
    separate = _littlebird(pack_size=4, pack_output_projection="separate").train()
    separate.encoder.pack_embeddings.data.copy_(shared.encoder.pack_embeddings.data)  # random at init
    input_ids, attention_mask = make_batch(72)
    outputs = [m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state for m in (shared, separate)]
    torch.testing.assert_close(outputs[0], outputs[1])
    for out in outputs:
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    for index in range(2):
        layer, twin = shared.encoder.layer[index], separate.encoder.layer[index]
        summed = twin.attention.output.dense.weight.grad + twin.pack_attention.output.dense.weight.grad
        torch.testing.assert_close(layer.attention.output.dense.weight.grad, summed, atol=1e-5, rtol=1e-4)
        assert twin.pack_attention.output.dense.weight.grad.abs().sum() > 0  # the pack path contributes
