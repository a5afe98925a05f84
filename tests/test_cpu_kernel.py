"""longbird's fused CPU attention kernels (attention/cpu_kernel.py), bf16 and fp32, against the dense reference in
float64. Tolerances from the arithmetic (`_bound`):

bf16: scores are exact products of bf16 values summed in fp32 (error ~1e-7 relative), the softmax is fp32 with an
exponential good to 5.6e-5 relative (the kernel's degree-4 polynomial), each probability is rounded to bf16 before
its product with V (relative error <= 2^-8 per term, so at most 2^-8 * max|v| on a convex combination of values) and
the output is rounded to bf16 (2^-8 * |o| <= 2^-8 * max|v|): |out - ref| <= (2^-7 + 6e-5) * max|v| plus the fp32
terms. SDPA's bf16 kernel rounds the probabilities and the output the same way.

fp32 (u = 2^-24): a score sums d products and is scaled (and has the BiALiBi distance subtracted), so its error is
at most (d + 3)·u·S, S bounding |score| and its terms (scale·max Σ|q_i k_i| + max|D|); each unnormalised probability
exp(s − m) then carries its score's and the maximum's error, the subtraction's rounding (u·2S) and the
exponential's (Cephes' degree-6 polynomial: 1.18e-7 relative, measured over [-87, 0] in steps of 1e-6); the
normalised output adds twice that relative error and the fp32 sums over L keys ((L + 2)·u each for numerator and
denominator), all times max|v|. The bound holds for both fp32 kernels, AVX-512 and AVX2: the same products and
exponential, summed in other vector widths (the bound takes any order of the sums).
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from conftest import VOCAB, make_batch
from transformers import BertConfig, BertModel

import longbird
from longbird.attention import bigbird as blocked
from longbird.attention import bigbird_pattern, cpu_kernel

needs_kernel = pytest.mark.skipif(not (cpu_kernel.cpu_supports_kernel() and cpu_kernel.compiler()),
                                  reason="needs a CPU with AVX-512 BF16 and a C++ compiler")
needs_fp32_kernel = pytest.mark.skipif(not (cpu_kernel.cpu_supports_kernel(torch.float32) and cpu_kernel.compiler()),
                                       reason="needs a CPU with AVX-512 or AVX2 and FMA, and a C++ compiler")
# Where fp32 takes the AVX-512 kernel, the AVX2 one (LONGBIRD_CPU_KERNEL=avx2) is tested beside it; on a CPU without
# AVX-512 plain fp32 is the AVX2 kernel already.
needs_avx2_beside_avx512 = pytest.mark.skipif(
    cpu_kernel.cpu_instruction_sets(torch.float32) != ("avx512", "avx2") or not cpu_kernel.compiler(),
    reason="the AVX2 kernel is tested on its own only beside the AVX-512 one (plain fp32 runs it elsewhere)")
SETTINGS = [pytest.param((torch.bfloat16, "1"), marks=needs_kernel, id="bf16"),
            pytest.param((torch.float32, "1"), marks=needs_fp32_kernel, id="fp32"),
            pytest.param((torch.float32, "avx2"), marks=needs_avx2_beside_avx512, id="fp32-avx2")]
U = 2.0 ** -24  # fp32 unit roundoff
EXP_ERROR = 1.2e-7  # the fp32 kernel's exponential, relative (measured: 1.18e-7, module docstring)


@pytest.fixture(params=SETTINGS)
def dtype(request, monkeypatch):
    """The dtype a test runs the kernel in, with LONGBIRD_CPU_KERNEL set to pick the library (`SETTINGS`)."""
    dtype, setting = request.param
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", setting)
    if setting == "avx2":
        assert cpu_kernel.instruction_set(dtype) == "avx2"
    return dtype


def _bound(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keys: int | None = None,
           distance: float = 0.0) -> float:
    """|kernel − float64 reference| allowed for these inputs (module docstring); `keys`: most keys one query reads
    (default: all of `key`'s), `distance`: the largest BiALiBi distance subtracted from a score."""
    largest = value.abs().max().item()
    if value.dtype == torch.bfloat16:
        return (2.0 ** -7 + 6e-5) * largest + 1e-6
    dim = query.shape[-1]
    keys = key.shape[-2] if keys is None else keys
    products = query.double().abs().flatten(0, -2) @ key.double().abs().flatten(0, -2).T  # Σ|q_i k_i| per pair
    span = dim ** -0.5 * products.max().item() + distance
    score = (dim + 3) * U * span
    probability = 2 * score + 2 * U * span + EXP_ERROR
    return (2 * probability + 2 * (keys + 2) * U) * largest + 1e-7


def _reference(query, key, value, allowed):
    """float64 softmax attention; a query row with no allowed key gives 0 (as SDPA and the kernel do)."""
    scores = query.double() @ key.double().transpose(-1, -2) / query.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ value.double()


@pytest.mark.parametrize("dim, value_dim, block_rows, query_rows", [(32, 32, 64, 64), (64, 64, 24, 6), (2, 16, 5, 1),
                                                                     (128, 48, 32, 13)])
def test_attend_blocks_equals_the_reference_with_blocks_read_in_place(dim, value_dim, block_rows, query_rows, dtype):
    """Groups read key blocks from anywhere in a pool (repeated, out of order), with partly masked blocks, wholly
    masked ones (offset -1) and one group with no allowed key (zeros); keys per group not a multiple of 32 and
    query rows not a multiple of 4 run the padded tails."""
    generator = torch.Generator().manual_seed(dim + block_rows)
    pool_blocks, groups, per_group = 7, 5, 3
    keys = torch.randn(pool_blocks * block_rows, dim, generator=generator).to(dtype)
    values = torch.randn(pool_blocks * block_rows, value_dim, generator=generator).to(dtype)
    queries = torch.randn(groups * query_rows, dim, generator=generator).to(dtype)
    mask = (torch.rand(pool_blocks * block_rows, generator=generator) > 0.3).to(torch.uint8)
    chosen = torch.randint(0, pool_blocks, (groups, per_group), generator=generator)
    mask_offsets = chosen * block_rows
    mask_offsets[1, 0] = -1
    mask_offsets[4] = -1  # group 4 reads no key
    out = torch.full((groups * query_rows, value_dim), 7.0).to(dtype)
    offsets = torch.arange(groups) * query_rows
    cpu_kernel.attend_blocks(queries, offsets * dim, query_rows, keys, chosen * block_rows * dim, values,
                             chosen * block_rows * value_dim, mask, mask_offsets, block_rows, out,
                             offsets * value_dim, dim ** -0.5)
    for group in range(groups):
        rows = torch.cat([torch.arange(block * block_rows, (block + 1) * block_rows) for block in chosen[group]])
        allowed = torch.cat([mask[offset: offset + block_rows].bool() if offset >= 0 else
                             torch.zeros(block_rows, dtype=torch.bool) for offset in mask_offsets[group].tolist()])
        expected = _reference(queries[group * query_rows:(group + 1) * query_rows], keys[rows], values[rows],
                              allowed[None])
        got = out[group * query_rows:(group + 1) * query_rows].double()
        assert (got - expected).abs().max().item() <= _bound(queries, keys, values, per_group * block_rows), group
    assert out[4 * query_rows:].abs().max() == 0


def _pattern_cases():
    return [  # (blocks, block size, heads, random blocks, first-block reach, last global)
        (12, 32, 3, 2, 0, True),   # ITC with random blocks
        (10, 32, 2, 0, 4, False),  # the long reader's conversion: first-reads-source, no random blocks
        (3, 16, 2, 1, 0, True),    # one middle block
        (1, 32, 2, 0, 0, True),    # one block: the global block alone
    ]


@pytest.mark.parametrize("blocks, block, heads, random_blocks, reach, last_global", _pattern_cases())
@pytest.mark.parametrize("value_dim", [32, 64])
def test_bigbird_attention_in_the_kernel_equals_the_dense_reference(blocks, block, heads, random_blocks, reach,
                                                                    last_global, value_dim, dtype):
    """bigbird_attention in bf16 or fp32 at inference takes the kernel (no SDPA call), on q/k/v laid out as the model's
    projections leave them ((B, l, H, d) transposed, not contiguous), with a padded row; real query rows equal the
    dense reference with the pattern as its mask, within the dtype's bound."""
    pattern = bigbird_pattern(blocks, block, heads, random_blocks, 1, 0, "seeded", reach, last_global, 0)
    length, batch, dim = blocks * block, 2, 32
    generator = torch.Generator().manual_seed(blocks)
    query, key = (torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2).to(dtype)
                  for _ in range(2))
    value = torch.randn(batch, length, heads, value_dim, generator=generator).transpose(1, 2).to(dtype)
    key_mask = torch.ones(batch, length, dtype=torch.bool)
    key_mask[1, length - block // 2 - 3:] = False
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    with torch.inference_mode():
        torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        try:
            out = blocked.bigbird_attention(query, key, value, key_mask, pattern)
        finally:
            torch.nn.functional.scaled_dot_product_attention = original
    assert not calls
    expected = _reference(query, key, value, pattern.materialize()[None] & key_mask[:, None, None, :])
    real = key_mask[:, None, :, None]
    assert ((out.double() - expected).abs() * real).max().item() <= _bound(query, key, value)
    # a row alone gives bit-identical outputs (the kernel's arithmetic per group does not see the batch)
    with torch.inference_mode():
        alone = blocked.bigbird_attention(query[1:], key[1:], value[1:], key_mask[1:], pattern)
    assert torch.equal(alone, out[1:])


@pytest.mark.parametrize("length", [1, 37, 64, 300])
@pytest.mark.parametrize("value_dim", [32, 64])
@pytest.mark.parametrize("queries", [None, 16])
def test_full_attention_in_the_kernel_equals_the_dense_reference(length, value_dim, queries, dtype):
    """full_attention in bf16 or fp32 at inference (every length up to the source's) takes the kernel, with a padded row
    and values wider than queries and keys (TAPE), and with fewer queries than keys (LittleBird's pack attention:
    16 pack queries over the tokens); equal to the reference within the dtype's bound, a row alone bit-equal to the same
    row in the batch, and no key mask the same as an all-true one."""
    from longbird.attention.full import full_attention

    heads, dim = 3, 32
    generator = torch.Generator().manual_seed(length)
    query = torch.randn(2, queries or length, heads, dim, generator=generator).transpose(1, 2).to(dtype)
    key = torch.randn(2, length, heads, dim, generator=generator).transpose(1, 2).to(dtype)
    value = torch.randn(2, length, heads, value_dim, generator=generator).transpose(1, 2).to(dtype)
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, max(1, length // 2):] = False
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention
    with torch.inference_mode():
        torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        try:
            out = full_attention(query, key, value, key_mask)
            alone = full_attention(query[1:], key[1:], value[1:], key_mask[1:])
            unmasked = full_attention(query[:1], key[:1], value[:1], None)
        finally:
            torch.nn.functional.scaled_dot_product_attention = original
    assert not calls
    expected = _reference(query, key, value, key_mask[:, None, None, :])
    assert (out.double() - expected).abs().max().item() <= _bound(query, key, value)
    assert torch.equal(alone, out[1:]) and torch.equal(unmasked, out[:1])


def test_the_kernel_is_only_taken_for_cpu_inference_in_bf16_and_fp32(monkeypatch):
    """fp16, mixed dtypes, autograd on inputs that need gradients, dropout, value widths past the kernel's registers,
    odd head sizes in bf16 (read as pairs) and LONGBIRD_CPU_KERNEL=0 all keep SDPA; bf16 needs AVX-512 BF16, fp32
    AVX-512 or AVX2 with FMA. The call rules (`_call_fits`) are asserted in both kernel dtypes whatever this CPU has:
    through `usable` alone a CPU without a bf16 kernel would pass every bf16 case for want of the kernel."""
    for dtype in cpu_kernel.KERNEL_DTYPES:
        q = torch.zeros(1, 2, 64, 32, dtype=dtype)
        assert cpu_kernel._call_fits(q, q, q, 0.0)
        assert not cpu_kernel._call_fits(q.half(), q.half(), q.half(), 0.0)
        assert not cpu_kernel._call_fits(q, q.double(), q, 0.0)
        assert not cpu_kernel._call_fits(q, q, q.clone().requires_grad_(), 0.0)
        with torch.no_grad():  # inference on parameters that need gradients takes the kernel
            assert cpu_kernel._call_fits(q, q, q.clone().requires_grad_(), 0.0)
        assert not cpu_kernel._call_fits(q, q, q, 0.1)
        wide = torch.zeros(1, 2, 64, cpu_kernel.MAX_VALUE_DIM + 16, dtype=dtype)
        assert not cpu_kernel._call_fits(q, q, wide, 0.0)
        assert not cpu_kernel._call_fits(q, q, q[..., :24], 0.0)  # values in whole 16-lane registers only
        assert cpu_kernel._call_fits(q, q, q[..., :16], 0.0)
        # bf16 reads q and k as pairs: an odd width is refused there, read one value at a time in fp32
        assert cpu_kernel._call_fits(q[..., :31], q[..., :31], q, 0.0) == (dtype == torch.float32)
    q = torch.zeros(1, 2, 64, 32)
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")
    assert not cpu_kernel.usable(q.bfloat16(), q.bfloat16(), q.bfloat16()) and not cpu_kernel.usable(q, q, q)
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "1")
    for dtype in cpu_kernel.KERNEL_DTYPES:
        x = q.to(dtype)
        assert cpu_kernel.usable(x, x, x) == (cpu_kernel.cpu_supports_kernel(dtype) and bool(cpu_kernel.compiler()))
        assert not cpu_kernel.usable(x, x, x, dropout_p=0.1)


needs_compiler = pytest.mark.skipif(not cpu_kernel.compiler(), reason="needs a C++ compiler")


@needs_compiler
@pytest.mark.parametrize("name", list(cpu_kernel.LIBRARIES))
def test_the_kernel_is_built_once_into_the_cache_by_rename(tmp_path, monkeypatch, name):
    """A fresh cache directory gets exactly the hashed library (no temporary file left), whichever instruction set it
    is for (building needs only the compiler, not the CPU); a compiler that fails leaves nothing behind, logs why, and
    the process keeps SDPA."""
    monkeypatch.setenv("LONGBIRD_KERNEL_CACHE", str(tmp_path / "ok"))
    cpu_kernel.build(cpu_kernel.library_path(name), name)
    assert [p.name for p in (tmp_path / "ok").iterdir()] == [cpu_kernel.library_path(name).name]

    monkeypatch.setenv("LONGBIRD_KERNEL_CACHE", str(tmp_path / "broken"))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match="building the CPU attention kernels failed"):
        cpu_kernel.build(cpu_kernel.library_path(name), name)
    assert list((tmp_path / "broken").iterdir()) == []
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        cpu_kernel.build(cpu_kernel.library_path(name), name)

    cpu_kernel._load.cache_clear()
    try:
        assert cpu_kernel._load(name) is None
        for dtype in cpu_kernel.KERNEL_DTYPES:
            if cpu_kernel.instruction_set(dtype) == name:
                assert not cpu_kernel.available(dtype)
    finally:
        cpu_kernel._load.cache_clear()


def test_the_instruction_set_is_the_fastest_the_cpu_has_unless_the_environment_says(monkeypatch):
    """fp32 takes AVX-512 where the CPU has it, else AVX2 with FMA; bf16 only AVX-512 BF16. LONGBIRD_CPU_KERNEL=avx2
    keeps fp32 on the AVX2 kernel (and bf16 on SDPA), =0 everything on SDPA. On this machine the fp32 sets follow
    torch's own AVX-512 / AVX2 checks."""
    real = cpu_kernel.cpu_instruction_sets(torch.float32)
    assert ("avx512" in real) == torch.cpu._is_avx512_supported()
    assert ("avx2" in real) <= torch.cpu._is_avx2_supported()
    assert cpu_kernel.cpu_instruction_sets(torch.float16) == ()

    def machine(fp32_sets, bf16_sets):
        monkeypatch.setattr(cpu_kernel, "cpu_instruction_sets",
                            lambda dtype=torch.bfloat16: fp32_sets if dtype == torch.float32 else bf16_sets)

    choices = {}
    for fp32_sets, bf16_sets in ((("avx512", "avx2"), ("avx512",)), (("avx2",), ()), ((), ())):
        machine(fp32_sets, bf16_sets)
        for setting in ("1", "avx2", "0", " AVX2 "):
            monkeypatch.setenv("LONGBIRD_CPU_KERNEL", setting)
            choices[fp32_sets, setting] = (cpu_kernel.instruction_set(torch.float32),
                                           cpu_kernel.instruction_set(torch.bfloat16))
    assert choices[("avx512", "avx2"), "1"] == ("avx512", "avx512")
    assert choices[("avx512", "avx2"), "avx2"] == choices[("avx512", "avx2"), " AVX2 "] == ("avx2", None)
    assert choices[("avx2",), "1"] == choices[("avx2",), "avx2"] == ("avx2", None)
    assert all(choices[sets, "0"] == (None, None) for sets in (("avx512", "avx2"), ("avx2",), ()))
    assert choices[(), "1"] == (None, None)


@needs_kernel
def test_a_kobigbird_model_in_bf16_reads_alike_with_and_without_the_kernel(monkeypatch):
    """A converted model (32-wide heads, blocks of 32) at inference in bf16 past its source length: the kernel is
    called in every layer, and the hidden states are as far from the fp32 model's as SDPA's bf16 path is (the same
    roundings in another order, so within twice SDPA's distance and one bf16 step, 2^-8, of the unit-scale states).
    Control: the kernel reading each query group's keys from the previous group's blocks lands far outside that."""
    model, input_ids, attention_mask = _small_kobigbird()
    real = attention_mask.bool()
    with torch.no_grad():
        reference = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def distance(out):
        return (out.float() - reference)[real].abs().max().item()

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fused, sdpa = _with_and_without_the_kernel(monkeypatch, model, input_ids, attention_mask)
        monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "1")
        wrong = _with_wrong_key_blocks(monkeypatch, model, input_ids, attention_mask)
    allowed = 2 * distance(sdpa) + 2.0 ** -8
    assert distance(fused) <= allowed
    assert distance(wrong) > 8 * allowed


@pytest.mark.parametrize("setting", [pytest.param("1", marks=needs_fp32_kernel, id="fp32"),
                                     pytest.param("avx2", marks=needs_avx2_beside_avx512, id="fp32-avx2")])
def test_a_kobigbird_model_in_fp32_reads_alike_with_and_without_the_kernel(monkeypatch, setting):
    """The same model in fp32 (no autocast: what `answer` and `serve` run by default): the fp32 kernel is called in
    every layer, and its hidden states are as close to exact (the same model in float64, SDPA's path) as SDPA's fp32
    path is: both run the same fp32 products, exponentials and sums in another order, so their roundings are of one
    size; allowed is twice SDPA's distance plus four fp32 steps of the largest state (|x| < 4: 2^-22 each). Measured
    on a Zen 4 EPYC: kernel 2.0e-6 (AVX2 library 2.3e-6), SDPA 1.9e-6, allowed 4.7e-6. Control: keys read from the
    wrong blocks move the states by orders of magnitude more."""
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", setting)
    model, input_ids, attention_mask = _small_kobigbird()
    real = attention_mask.bool()
    with torch.no_grad():
        fused, sdpa = _with_and_without_the_kernel(monkeypatch, model, input_ids, attention_mask)
        exact = copy.deepcopy(model).double()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        monkeypatch.setenv("LONGBIRD_CPU_KERNEL", setting)
        wrong = _with_wrong_key_blocks(monkeypatch, model, input_ids, attention_mask)

    def distance(out):
        return (out.double() - exact)[real].abs().max().item()

    assert fused.dtype == torch.float32 and exact[real].abs().max().item() < 4
    assert distance(fused) <= 2 * distance(sdpa) + 4 * 2.0 ** -22
    assert distance(wrong) > 2.0 ** -6


def _words(pairs: torch.Tensor) -> torch.Tensor:
    """(..., 2) bf16 values as the int32 words the bf16 kernel reads: the first in the low half, the second high."""
    halves = pairs.view(torch.int16).to(torch.int32)
    return (halves[..., 0] & 0xFFFF) | (halves[..., 1] << 16)


@pytest.mark.parametrize("dim, value_dim, block_rows", [(32, 32, 64), (64, 64, 32), (40, 48, 32), (2, 16, 18)])
@pytest.mark.parametrize("odd_row_stride", [False, True])
def test_pack_blocks_lays_out_every_block_exactly_as_the_kernel_reads_it(dim, value_dim, block_rows, odd_row_stride,
                                                                         dtype):
    """Blocks taken from anywhere in a strided (B, H, l, d) layout (out of order, one twice) are packed exactly: fp32
    keys transposed to (d, block rows) and values copied; bf16 keys as (d/2, block rows) words of consecutive value
    pairs and values as (block rows/2, d_v) words of two consecutive rows. The sizes leave parts of 16 x 16 tiles
    (40 wide keys: 20 bf16 words; 18 rows); a row stride of odd length (no whole words in bf16) takes the word-by-word
    path. The AVX2 kernel's layout is its own: keys in chunks of 16, (block rows/16, d, 16), values in runs of 16
    columns, (d_v/16, block rows, 16); it refuses block rows that are not whole chunks (18 here)."""
    avx2 = dtype == torch.float32 and cpu_kernel.instruction_set(dtype) == "avx2"
    if dtype == torch.float32 and odd_row_stride:
        pytest.skip("fp32 keys are whole words at any stride")
    generator = torch.Generator().manual_seed(dim + block_rows)
    heads, length = 3, 4 * block_rows
    width = heads * (dim + value_dim) + (1 if odd_row_stride else 0)
    tokens = torch.randn(length, width, generator=generator).to(dtype)
    key = tokens[:, :heads * dim].view(1, length, heads, dim).transpose(1, 2)
    value = tokens[:, heads * dim:heads * (dim + value_dim)].view(1, length, heads, value_dim).transpose(1, 2)
    chosen = torch.tensor([[2, 0], [3, 3], [1, 2]])  # (head, block): out of order, one block twice
    head = torch.arange(heads)[:, None].expand_as(chosen)
    first = chosen * block_rows
    key_offsets = (head * key.stride(1) + first * key.stride(2)).reshape(-1)
    value_offsets = (head * value.stride(1) + first * value.stride(2)).reshape(-1)
    if avx2 and block_rows % 16:
        with pytest.raises(ValueError, match="multiples of 16"):
            cpu_kernel.pack_blocks(key, key_offsets, value, value_offsets, block_rows)
        return
    key_packed, value_packed = cpu_kernel.pack_blocks(key, key_offsets, value, value_offsets, block_rows)
    blocks = [(h, b) for h, b in zip(head.reshape(-1).tolist(), chosen.reshape(-1).tolist())]
    key_rows = torch.stack([key[0, h, b * block_rows:(b + 1) * block_rows] for h, b in blocks])
    value_rows = torch.stack([value[0, h, b * block_rows:(b + 1) * block_rows] for h, b in blocks])
    if avx2:
        chunks = key_rows.reshape(len(blocks), block_rows // 16, 16, dim).transpose(2, 3)
        runs = value_rows.reshape(len(blocks), block_rows, value_dim // 16, 16).permute(0, 2, 1, 3)
        assert torch.equal(key_packed.reshape(len(blocks), -1), chunks.reshape(len(blocks), -1))
        assert torch.equal(value_packed.reshape(len(blocks), -1), runs.reshape(len(blocks), -1))
        return
    if dtype == torch.float32:
        expected_keys, expected_values = key_rows.transpose(1, 2), value_rows
    else:
        expected_keys = _words(key_rows.reshape(len(blocks), block_rows, dim // 2, 2)).transpose(1, 2)
        expected_values = _words(value_rows.reshape(len(blocks), block_rows // 2, 2, value_dim).transpose(2, 3))
    assert torch.equal(key_packed, expected_keys) and torch.equal(value_packed, expected_values)


def test_a_profiler_sees_every_kernel_call_as_a_range_of_its_own(dtype):
    """A ctypes call is no operator, so the kernels would be missing from torch.profiler's tables (the gap between
    the listed operators and the forward): while a profiler records, every call of the attention kernel and of the
    block packing is a range named after its C function, counted once per call, with its time as self time; without
    a profiler, the same calls run without one."""
    from torch.profiler import ProfilerActivity, profile

    model, input_ids, attention_mask = _small_kobigbird()
    calls = {"attend_blocks": 0, "pack_blocks": 0}
    originals = {name: getattr(cpu_kernel, name) for name in calls}

    def counted(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return call

    suffix = "bf16" if dtype == torch.bfloat16 else "fp32"
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        try:
            for name in calls:
                setattr(cpu_kernel, name, counted(name))
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                model(input_ids=input_ids, attention_mask=attention_mask)
        finally:
            for name, original in originals.items():
                setattr(cpu_kernel, name, original)
    events = {event.key: event for event in profiler.key_averages()}
    assert calls["attend_blocks"] >= model.config.num_hidden_layers and calls["pack_blocks"] >= 1
    for name, function in (("attend_blocks", f"longbird_block_attention_{suffix}"),
                           ("pack_blocks", f"longbird_pack_blocks_{suffix}")):
        assert events[function].count == calls[name]
        assert events[function].self_cpu_time_total > 0
    assert isinstance(cpu_kernel._profiled("x"), contextlib.nullcontext)


def _small_kobigbird():
    """Two layers, heads of 32, blocks of 32, one random block, read at 300 tokens (past the source's 128). Weights
    drawn at 10x BERT's initializer range, so that attention moves the states by O(1): at BERT's 0.02 a kernel
    reading the wrong key blocks moved them by 6e-4, less than any bf16 check could see."""
    torch.manual_seed(0)
    source = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=128, initializer_range=0.2)).eval()
    model = longbird.convert(source, max_length=512, block_size=32, num_random_blocks=1).eval()
    input_ids, attention_mask = make_batch(300)
    return model, input_ids, attention_mask


def _with_and_without_the_kernel(monkeypatch, model, input_ids, attention_mask):
    """The model's last hidden states with the kernel (called in every layer), then with it switched off (not
    called: SDPA)."""
    calls = []
    original = cpu_kernel.attend_blocks
    monkeypatch.setattr(cpu_kernel, "attend_blocks", lambda *a, **k: calls.append(1) or original(*a, **k))
    fused = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert len(calls) >= model.config.num_hidden_layers
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")
    calls.clear()
    sdpa = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert not calls
    return fused, sdpa


def _with_wrong_key_blocks(monkeypatch, model, input_ids, attention_mask):
    """The model's last hidden states with a plausible kernel bug: every query group reads the key blocks of the group
    before it (values where they belong)."""
    original = cpu_kernel.attend_blocks
    calls = []

    def wrong(query, query_offsets, query_rows, key, key_offsets, *rest, **kwargs):
        calls.append(1)
        return original(query, query_offsets, query_rows, key, key_offsets.roll(1, 0), *rest, **kwargs)

    monkeypatch.setattr(cpu_kernel, "attend_blocks", wrong)
    out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    monkeypatch.setattr(cpu_kernel, "attend_blocks", original)
    assert len(calls) >= model.config.num_hidden_layers
    return out


@pytest.mark.parametrize("preset, length", [("kobigbird", 100), ("kobigbird", 300), ("littlebird", 300)])
def test_a_compiled_graph_runs_the_kernel_and_equals_eager(preset, length, dtype, monkeypatch):
    """torch.compile(fullgraph=True) in bf16 (autocast) and fp32: at or below the source length full attention is
    traced, and the kernel enters the graph as one opaque op (`longbird::cpu_full_attention`); past it kobigbird's
    per-row op runs the blocked path, which calls the kernel; LittleBird's USW attention is an op of its own
    (`longbird::cpu_usw_attention`). Either way every layer calls the kernel, and the compiled model equals eager
    up to Inductor's reordered fp32 sums (LayerNorm, GELU), which can move a bf16 rounding of a unit-scale state by
    one step (2^-8) before the next product: 2^-6 on the LayerNorm-ed states of two layers. In fp32 compiled and
    eager run the same roundings in another order, so the compiled states are as close to exact (the model in
    float64, SDPA's path) as eager's: within twice eager's distance plus four fp32 steps of the largest state
    (|x| < 4: 2^-22 each). Measured on a Zen 4 EPYC: eager 0.87-0.96e-6, compiled 0.82-1.03e-6 from exact."""
    torch.manual_seed(0)
    source = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=128)).eval()
    extra = {"num_random_blocks": 1} if preset == "kobigbird" else {}
    model = longbird.convert(source, preset=preset, max_length=512, block_size=32, **extra).eval()
    input_ids, attention_mask = make_batch(length)
    calls = []
    original = cpu_kernel.attend_blocks
    torch._dynamo.reset()
    try:
        cpu_kernel.attend_blocks = lambda *a, **k: calls.append(1) or original(*a, **k)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            eager = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            calls.clear()
            compiled = torch.compile(model, fullgraph=True)(input_ids=input_ids,
                                                           attention_mask=attention_mask).last_hidden_state
    finally:
        cpu_kernel.attend_blocks = original
        torch._dynamo.reset()
    assert len(calls) >= model.config.num_hidden_layers
    real = attention_mask.bool()
    if dtype == torch.bfloat16:
        assert (compiled.float() - eager.float())[real].abs().max().item() <= 2.0 ** -6
        return
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def distance(out):
        return (out.double() - exact)[real].abs().max().item()

    assert exact[real].abs().max().item() < 4
    assert distance(compiled) <= 2 * distance(eager) + 4 * 2.0 ** -22


@pytest.mark.parametrize("pack, value_dim", [(32, 32), (64, 64), (0, 32)])
def test_littlebird_usw_attention_in_the_kernel_equals_the_dense_reference(pack, value_dim, dtype):
    """usw_attention in bf16 or fp32 at inference takes the kernel (no SDPA call), the BiALiBi distance computed
    inside it from position ids: packed-context keys in front (D_C), a padded row, a jump in positions (Padding
    Insertion), slopes that differ per term, TAPE's wider values; equal to the dense reference within the dtype's
    bound on real query rows, and a row alone bit-equal to the same row in the batch."""
    from longbird.attention import littlebird
    from longbird.positions.alibi import BiALiBi

    batch, heads, n, block, dim = 2, 3, 6, 32, 32
    length = n * block
    generator = torch.Generator().manual_seed(pack + value_dim)
    query, key = (torch.randn(batch, length, heads, dim, generator=generator).transpose(1, 2).to(dtype)
                  for _ in range(2))
    value = torch.randn(batch, length, heads, value_dim, generator=generator).transpose(1, 2).to(dtype)
    pack_key = torch.randn(batch, heads, pack, dim, generator=generator).to(dtype) if pack else None
    pack_value = torch.randn(batch, heads, pack, value_dim, generator=generator).to(dtype) if pack else None
    key_mask = torch.ones(batch, length, dtype=torch.bool)
    key_mask[1, length - block - 5:] = False
    positions = torch.arange(length).expand(batch, length).clone()
    positions[1, 40:] += 7
    slopes = BiALiBi(heads)
    with torch.no_grad():
        slopes.alpha.mul_(1.3)
        slopes.gamma.mul_(0.7)
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def attend(rows):
        layout = littlebird.usw_layout(key_mask[rows], positions[rows], block, slopes)
        take = (lambda x: None if x is None else x[rows])
        return littlebird.usw_attention(query[rows], key[rows], value[rows], layout, slopes, take(pack_key),
                                        take(pack_value))

    with torch.inference_mode():
        torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        try:
            out, alone = attend(slice(None)), attend(slice(1, 2))
        finally:
            torch.nn.functional.scaled_dot_product_attention = original
    assert not calls
    double = (lambda x: None if x is None else x.double())
    expected = littlebird.usw_attention_reference(query.double(), key.double(), value.double(), key_mask, positions,
                                                  slopes, block, double(pack_key), double(pack_value))
    real = key_mask[:, None, :, None]
    distance = max(slopes.distance(positions, positions).abs().max().item(),
                   slopes.pack_distance(block).abs().max().item())
    every_key = key if not pack else torch.cat([pack_key, key], dim=2)
    every_value = value if not pack else torch.cat([pack_value, value], dim=2)  # outputs mix both: max|v| over both
    bound = _bound(query, every_key, every_value, pack + 4 * block, distance)
    assert ((out.double() - expected).abs() * real).max().item() <= bound
    assert torch.equal(alone, out[1:])


def test_the_kernel_cache_follows_longbirds_cache_directory(tmp_path, monkeypatch):
    """One setting moves the unpacked sources and the built kernels together: without $LONGBIRD_KERNEL_CACHE the
    kernels go to `kernels/` of the directory `sources.cache_root` chooses ($LONGBIRD_CACHE, then $XDG_CACHE_HOME)."""
    from longbird.sources import cache_root

    for name in ("LONGBIRD_KERNEL_CACHE", "LONGBIRD_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cpu_kernel.cache_dir() == cache_root() / "kernels" == tmp_path / "home" / ".cache" / "longbird" / "kernels"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cpu_kernel.cache_dir() == cache_root() / "kernels" == tmp_path / "xdg" / "longbird" / "kernels"
    monkeypatch.setenv("LONGBIRD_CACHE", str(tmp_path / "lb"))
    assert cpu_kernel.cache_dir() == cache_root() / "kernels" == tmp_path / "lb" / "kernels"
    monkeypatch.setenv("LONGBIRD_KERNEL_CACHE", str(tmp_path / "k"))
    assert cpu_kernel.cache_dir() == tmp_path / "k"
