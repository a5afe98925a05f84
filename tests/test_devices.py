"""The kernel suite on every device and dtype: each fast path (blocked and flex) against its dense reference,
outputs and gradients; batch independence; conversion equivalence at <= L; bf16/fp16 against fp32.

CUDA cases carry the `cuda` mark and are skipped where CUDA is absent (CI is CPU-only); run them on a GPU machine
with `pytest -m cuda`. On CPU flex_attention has no backward and is run unfused (eager) in the kernel tests, so
flex is checked there on outputs only; on CUDA it is compiled and checked on outputs and gradients.

Tolerances, as the relative error ||out - ref|| / ||ref|| against a fp32 reference computed from the same inputs:
fp32 1e-5 (1e-4 for gradients), bf16 1e-2, fp16 2e-3 (operand rounding; the softmax is fp32 everywhere).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertModel

import longbird
from longbird.attention import bigbird_attention, bigbird_pattern, reference_attention, usw_attention, usw_layout
from longbird.attention import usw_attention_reference
from longbird.attention.flex import bigbird_flex_attention, usw_flex_attention
from longbird.positions.alibi import BiALiBi

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[CUDA, pytest.mark.cuda])]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}
GRAD_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 5e-3}
BLOCK = 16  # the smallest block flex's GPU tiles take
HEADS, HEAD_DIM = 4, 16
SOURCE_LENGTH = 64


def _assert_close(out, ref, rtol, where=None, atol=1e-5, what=""):
    """||out - ref|| <= rtol ||ref|| + atol. The atol is for gradients that are exactly 0 in exact arithmetic
    (a key bias under softmax): rounding noise of ~1e-9 per element on both sides (norms up to ~3e-6 on CUDA)."""
    out, ref = out.float(), ref.float()
    if where is not None:
        out, ref = out[where], ref[where]
    error, scale = (out - ref).norm().item(), ref.norm().item()
    assert error <= rtol * scale + atol, f"{what}: ||out - ref|| = {error:.3g}, ||ref|| = {scale:.3g}, rtol {rtol}"


def _flex_checks_gradients(device):
    return device == "cuda"


def _inputs(device, dtype, length, seed, grad, batch=2, pack=0):
    generator = torch.Generator().manual_seed(seed)
    make = lambda n: torch.randn(batch, HEADS, n, HEAD_DIM, generator=generator).to(device, dtype)  # noqa: E731
    q, k, v = make(length), make(length), make(length)
    pk, pv = (make(pack), make(pack)) if pack else (None, None)
    tensors = [t for t in (q, k, v, pk, pv) if t is not None]
    for tensor in tensors:
        tensor.requires_grad_(grad)
    key_mask = torch.ones(batch, length, dtype=torch.bool, device=device)
    key_mask[1, length - 5:] = False  # a padded row (a partial block)
    if length > 3 * BLOCK:
        key_mask[1, length - 2 * BLOCK - 3:] = False  # ... and a block of pure padding
    return (q, k, v, pk, pv), tensors, key_mask


def _compare(out, ref, tensors, key_mask, dtype_name, grad):
    where = key_mask[:, None, :, None].expand_as(out)  # real query rows
    _assert_close(out, ref, TOLERANCE[dtype_name], where, what="output")
    if not grad:
        return
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype) * where
    got = torch.autograd.grad(out, tensors, grad_out)
    want = torch.autograd.grad(ref, tensors, grad_out.to(ref.dtype))
    for index, (g, w) in enumerate(zip(got, want)):
        _assert_close(g, w, GRAD_TOLERANCE[dtype_name], what=f"gradient {index}")


def _upcast(tensors):
    return [t.float() if t is not None else None for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", ["blocked", "flex", "flex-other-tiling"])
@pytest.mark.parametrize("length", [BLOCK, 3 * BLOCK, 10 * BLOCK, 21 * BLOCK])
def test_bigbird_kernels_equal_dense_reference(device, dtype_name, backend, length):
    """backend "flex": on CPU exact b-token tiles (outputs only: no CPU backward), on CUDA with autograd, hence
    128-token tiles; "flex-other-tiling": on CPU forced 128-token tiles (the CUDA training layout), on CUDA inference
    (exact b-token tiles)."""
    grad = backend == "blocked" or (backend == "flex" and _flex_checks_gradients(device))
    (q, k, v, _, _), tensors, key_mask = _inputs(device, DTYPES[dtype_name], length, length, grad)
    pattern = bigbird_pattern(length // BLOCK, BLOCK, HEADS, 3, seed=1, layer=0)
    if backend == "blocked":
        out = bigbird_attention(q, k, v, key_mask, pattern)
    else:
        out = bigbird_flex_attention(q, k, v, key_mask, pattern, compiled=device == "cuda",
                                     tile=128 if backend == "flex-other-tiling" and device == "cpu" else None)
    dense = pattern.materialize().to(device)[None] & key_mask[:, None, None, :]
    ref = reference_attention(*_upcast([q, k, v]), dense)
    _compare(out, ref, tensors, key_mask, dtype_name, grad)


def _bialibi(device):
    bias = BiALiBi(HEADS)
    with torch.no_grad():  # distinct α, β, γ so a mix-up between them shows
        bias.alpha.mul_(3.0)
        bias.gamma.mul_(0.5)
    return bias.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", ["blocked", "flex", "flex-other-tiling"])
@pytest.mark.parametrize("length,pack", [(BLOCK, 0), (3 * BLOCK, 5), (10 * BLOCK, 16), (21 * BLOCK, 40)])
def test_usw_kernels_equal_dense_reference(device, dtype_name, backend, length, pack):
    grad = backend == "blocked" or (backend == "flex" and _flex_checks_gradients(device))
    (q, k, v, pk, pv), tensors, key_mask = _inputs(device, DTYPES[dtype_name], length, length + pack, grad, pack=pack)
    positions = torch.arange(length, device=device).expand(2, -1).clone()
    positions[1, 3:] += 11  # a Padding-Insertion gap
    bias = _bialibi(device)
    if backend == "blocked":
        out = usw_attention(q, k, v, usw_layout(key_mask, positions, BLOCK, bias), bias, pk, pv)
    else:
        out = usw_flex_attention(q, k, v, key_mask, positions, bias, BLOCK, pk, pv, compiled=device == "cuda",
                                 tile=128 if backend == "flex-other-tiling" and device == "cpu" else None)
    ref = usw_attention_reference(*_upcast([q, k, v]), key_mask, positions, bias, BLOCK, *_upcast([pk, pv]))
    if grad:
        tensors = tensors + [bias.alpha, bias.beta, bias.gamma]
    _compare(out, ref, tensors, key_mask, dtype_name, grad)


def _source(seed=0):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=99, hidden_size=HEADS * HEAD_DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                        intermediate_size=128, max_position_embeddings=SOURCE_LENGTH, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertModel(config).eval()
    with torch.no_grad():  # random init leaves LayerNorm at identity and biases at zero: perturb them
        for name, parameter in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _converted(preset, backend="auto", **overrides):
    settings = dict(max_length=512, block_size=BLOCK, attention_backend=backend)
    if preset == "kobigbird":  # sparse from 2 blocks on, so short tests reach the sparse kernel
        settings.update(num_random_blocks=2, full_attention_max_length=2 * BLOCK)
    if preset == "littlebird":
        settings.update(pack_size=8)
    return longbird.convert(_source(), preset=preset, **settings, **overrides)


def _batch(length, device, batch=2, seed=0):
    generator = torch.Generator().manual_seed(seed + length)
    input_ids = torch.randint(5, 99, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[1:, length - length // 3:] = 0
    input_ids[attention_mask == 0] = 0
    return input_ids.to(device), attention_mask.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ["kobigbird", "littlebird"])
@pytest.mark.parametrize("backend", ["blocked", "flex"])
@pytest.mark.parametrize("length", [41, 160, 333])
def test_model_equals_reference_implementation(device, preset, backend, length):
    if backend == "flex" and device == "cpu":
        pytest.skip("flex on CPU is inference-only: covered by test_cpu_flex_inference_equals_blocked")
    _assert_model_equals_reference(_converted(preset, backend).to(device), device, length)


def _assert_model_equals_reference(model, device, length) -> dict:
    """`model` against its `attn_implementation="reference"` twin on a padded batch: outputs and every parameter
    gradient. Returns the reference gradients by parameter name."""
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "reference"
    input_ids, attention_mask = _batch(length, device)
    out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    ref = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    _assert_close(out, ref, 1e-5, real, what="output")
    probe = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(0)).to(device)
    (out[real] @ probe).sum().backward()
    (ref[real] @ probe).sum().backward()
    gradients = {}
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        if r.grad is not None:
            _assert_close(p.grad, r.grad, 1e-4, what=name)
            gradients[name] = r.grad
    return gradients


def test_cpu_flex_inference_equals_blocked():
    """Compiled flex on CPU (LittleBird's fp32 inference backend there; BigBird's when asked for) computes what the
    blocked kernels compute."""
    for preset in ("kobigbird", "littlebird"):
        flex, blocked = _converted(preset, "flex"), _converted(preset, "blocked")
        input_ids, attention_mask = _batch(333, "cpu")
        with torch.inference_mode():
            out = flex(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            ref = blocked(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        _assert_close(out, ref, 1e-5, attention_mask.bool(), what=preset)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["blocked", "flex"])
def test_littlebird_rows_do_not_depend_on_their_batch(device, backend):
    if backend == "flex" and device == "cpu":
        pytest.skip("flex on CPU is inference-only")
    model = _converted("littlebird", backend).to(device)
    lengths = [7, 2 * BLOCK - 1, 2 * BLOCK + 1, 5 * BLOCK, 9 * BLOCK + 3]
    longest = max(lengths)
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, 99, (length,), generator=generator).to(device) for length in lengths]
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    for index, row in enumerate(rows):
        input_ids[index, :len(row)], attention_mask[index, :len(row)] = row, 1
    batched = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    for index, row in enumerate(rows):
        alone = model(input_ids=row[None]).last_hidden_state[0]
        assert (batched[index, :len(row)] - alone).abs().max() <= 1e-5, lengths[index]


@pytest.mark.parametrize("device", DEVICES)
def test_converted_equals_source_up_to_L(device):
    source = _source().to(device)
    for preset in ("kobigbird", "full"):
        model = longbird.convert(_source(), preset=preset, max_length=512, block_size=BLOCK).to(device)
        for length in (1, 2, 17, 63, SOURCE_LENGTH):
            input_ids, attention_mask = _batch(length, device)
            with torch.no_grad():
                expected = source(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                actual = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            real = attention_mask.bool()
            assert (expected - actual)[real].abs().max() <= 1e-5, (preset, length)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ["kobigbird", "littlebird"])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_half_precision_model_within_cosine_0999_of_fp32(device, preset, dtype_name):
    _assert_half_precision_within_cosine_0999(_converted(preset).to(device), device, dtype_name)


def _assert_half_precision_within_cosine_0999(model, device, dtype_name):
    input_ids, attention_mask = _batch(333, device)
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        out = model.to(DTYPES[dtype_name])(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert out.dtype == DTYPES[dtype_name]
    real = attention_mask.bool()
    cosine = torch.nn.functional.cosine_similarity(out.float()[real], reference[real], dim=-1)
    assert cosine.min() >= 0.999, cosine.min().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", ["kobigbird", "littlebird"])
def test_gradient_checkpointing_gives_the_same_gradients(device, preset):
    model = _converted(preset).to(device).train()
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable()
    assert checkpointed.encoder.gradient_checkpointing
    input_ids, attention_mask = _batch(160, device)
    for candidate in (model, checkpointed):
        out = candidate(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        out.float().pow(2).mean().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), checkpointed.named_parameters()):
        if p.grad is not None:
            _assert_close(q.grad, p.grad, 1e-5, what=name)


@pytest.mark.parametrize("device", DEVICES)
def test_plans_masks_and_tables_follow_the_input_device(device):
    """Nothing in a forward assumes CPU: patterns, layouts and masks are made on the input's device."""
    from longbird.attention.flex import bigbird_block_table, usw_block_table

    pattern = bigbird_pattern(12, BLOCK, HEADS, 3, seed=0, layer=0)
    assert bigbird_block_table(pattern, torch.device(device)).device.type == device
    assert usw_block_table(12, 1, torch.device(device)).device.type == device
    key_mask = torch.ones(1, 12 * BLOCK, dtype=torch.bool, device=device)
    layout = usw_layout(key_mask, torch.arange(12 * BLOCK, device=device)[None], BLOCK, _bialibi(device))
    assert {t.device.type for t in (layout.mask, layout.left, layout.right, layout.cls)} == {device}


TAPE_ATTENTIONS = ["full", "bigbird", "littlebird"]


def _tape_converted(attention):
    """`preset="tape"` with each attention, TAPE maps non-zero in every layer (at init they add nothing)."""
    settings = dict(max_length=512, block_size=BLOCK)
    if attention == "bigbird":
        settings.update(num_random_blocks=2, full_attention_max_length=2 * BLOCK)
    if attention == "littlebird":
        settings.update(pack_size=8)
    model = longbird.convert(_source(), preset="tape", attention=attention, **settings)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "tape_" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attention", TAPE_ATTENTIONS)
def test_tape_model_equals_reference_implementation(device, attention):
    """TAPE with each kernel (the sparse ones run blocked: flex takes V only as wide as Q) against the dense oracle,
    outputs and every gradient, TAPE maps included, at a sparse length with a padded row."""
    gradients = _assert_model_equals_reference(_tape_converted(attention).to(device), device, 160)
    assert any("tape_" in name and bool(gradient.abs().max() > 0) for name, gradient in gradients.items())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attention", TAPE_ATTENTIONS)
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_tape_half_precision_within_cosine_0999_of_fp32(device, attention, dtype_name):
    _assert_half_precision_within_cosine_0999(_tape_converted(attention).to(device).eval(), device, dtype_name)


@pytest.mark.cuda
@CUDA
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("plan", ["op", "device"])
def test_compiled_kobigbird_makes_its_row_plan_on_the_gpu_and_equals_eager(plan, mode, monkeypatch):
    """On CUDA a compiled kobigbird makes its per-row plan in the op (the default: it reads the rows' lengths on the
    host, and CUDA graphs leave it out) or on the device (`LONGBIRD_ROW_PLAN=device`, no host read, so
    `reduce-overhead` could hold the whole forward in one CUDA graph): a batch of a sparse row, a shorter sparse row
    and a full one equals eager on every real token, on the first call and on a replay with other ids. (On the CPU
    both plans are checked in tests/test_device_rows.py.)"""
    from longbird import dispatch

    monkeypatch.setenv("LONGBIRD_ROW_PLAN", plan)
    assert dispatch.compiled_row_plan() == plan
    model = _converted("kobigbird", backend="blocked").to("cuda").eval()
    input_ids, attention_mask = _batch(333, "cuda", batch=3)
    attention_mask[2, 2 * BLOCK - 3:] = 0  # a row short enough for full attention
    real = attention_mask.bool()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=False, mode=mode)
    if plan == "device" and torch.__version__.startswith("2.11."):
        # Inductor's loop merging fails on the device plan's index arithmetic (sympy Max/Min) with torch 2.11 on CUDA
        # (an H200, 2026-11-28), which is why the op is the default (`dispatch.compiled_row_plan`); asserted, so that
        # a torch 2.11 build where it compiles fails here and says so
        from torch._inductor.exc import InductorError

        with pytest.raises(InductorError, match="is not comparable"), torch.no_grad():
            compiled(input_ids=input_ids, attention_mask=attention_mask)
        return
    for seed in (0, 1):
        ids = torch.randint(5, 99, input_ids.shape, generator=torch.Generator().manual_seed(seed)).to("cuda")
        ids[~real] = 0
        with torch.no_grad():
            eager = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
            ours = compiled(input_ids=ids, attention_mask=attention_mask).last_hidden_state.clone()
        _assert_close(ours, eager, 1e-5, real, what=f"call {seed}")
