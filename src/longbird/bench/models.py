"""The models a benchmark sweep compares: longbird presets and transformers baselines, random init, by size."""

from __future__ import annotations

from collections.abc import Callable

import torch

from longbird.precision import native_bf16

BASE = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=2)
SIZES = {
    "base": BASE,
    # multilingual-e5-small's geometry (the embedded Korean source): 12 layers, hidden 384, 12 heads of 32, FFN 1536.
    "small": dict(BASE, hidden_size=384, intermediate_size=1536),
    "large": dict(BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    "smoke": dict(BASE, num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=256),
}
PRESET_SETTINGS = {
    "kobigbird": dict(attention="bigbird", position="absolute", block_size=64, num_random_blocks=3),
    "littlebird": dict(attention="littlebird", position="bialibi", block_size=64, pack_size=64),
    "full": dict(attention="full", position="absolute"),
    # TAPE's preset: full attention, the source's absolute table, identity states updated in every layer
    "tape": dict(attention="full", position="tape", tape_init="identity"),
    # TAPE over kobigbird's block-sparse attention (the states beside V through the blocked kernels)
    "tape-bigbird": dict(attention="bigbird", position="tape", tape_init="identity", block_size=64,
                         num_random_blocks=3),
}
BASELINES = ("hf-bigbird", "hf-longformer", "sdpa-roberta")
HF_BIGBIRD_BLOCK = 64  # transformers' BigBird baseline: kobigbird's blocks and random blocks


def compiled_name(name: str, mode: str) -> str:
    """A preset run through torch.compile: "kobigbird+compile", "kobigbird+compile:reduce-overhead"."""
    return f"{name}+compile" + ("" if mode == "default" else f":{mode}")


def eager_name(name: str) -> str:
    """The eager model a (possibly compiled) benchmark model name belongs to."""
    return name.split("+")[0]


def build_model(name: str, max_length: int, base: dict | None = None) -> torch.nn.Module:
    """A random-init encoder by name: a longbird preset or one of BASELINES."""
    base = dict(BASE if base is None else base)
    torch.manual_seed(0)
    if name in PRESET_SETTINGS:
        from ..config import LongBirdConfig
        from ..modeling import LongBirdModel

        # L = 512 as for BERT-size sources (kobigbird runs full attention up to L); a short sweep lowers it.
        config = LongBirdConfig(**base, max_position_embeddings=max_length,
                                source_max_positions=min(512, max_length // 2), **PRESET_SETTINGS[name])
        return LongBirdModel(config).eval()
    import transformers

    if name == "hf-bigbird":
        config = transformers.BigBirdConfig(**base, max_position_embeddings=max_length, attention_type="block_sparse",
                                            block_size=HF_BIGBIRD_BLOCK, num_random_blocks=3)
        return transformers.BigBirdModel(config).eval()
    if name == "hf-longformer":
        config = transformers.LongformerConfig(**base, max_position_embeddings=max_length + 2, attention_window=512,
                                               pad_token_id=1)
        return transformers.LongformerModel(config).eval()
    if name == "sdpa-roberta":
        config = transformers.RobertaConfig(**base, max_position_embeddings=max_length + 2, pad_token_id=1)
        model = transformers.RobertaModel(config, add_pooling_layer=False).eval()
        model.set_attn_implementation("sdpa")
        return model
    raise ValueError(f"unknown benchmark model {name!r}; choose from {tuple(PRESET_SETTINGS) + BASELINES}")


def forward_fn(model: torch.nn.Module, length: int, backward: bool, batch: int = 1,
               base: dict | None = None, call: Callable | None = None) -> Callable[[], torch.Tensor]:
    """A closure running one forward (and backward) at `length` and `batch`, on the model's device; `call`: what runs
    the model (e.g. a compiled wrapper of it; default the model itself)."""
    call = model if call is None else call
    vocab = (BASE if base is None else base)["vocab_size"]
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(length)
    input_ids = torch.randint(5, vocab, (batch, length), generator=generator).to(device)
    attention_mask = torch.ones_like(input_ids)

    def run():
        if backward:
            out = call(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            out.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
            return out.detach()
        with torch.inference_mode():
            return call(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    run.model = model
    return run


def linear_flops(length: int, base: dict | None = None) -> float:
    """FLOPs of the dense projections and FFN of one forward (the floor every model shares)."""
    base = BASE if base is None else base
    hidden, inner, layers = base["hidden_size"], base["intermediate_size"], base["num_hidden_layers"]
    return 2.0 * length * layers * (4 * hidden * hidden + 2 * hidden * inner)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_median_ms(fn: Callable[[], object], repeats: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of `fn()` on the current CUDA device, timed with CUDA events after `warmup` calls."""
    import statistics

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def matmul_throughput(dtype: torch.dtype, device: torch.device | str = "cpu", size=None, repeats: int = 5) -> float:
    """This device's dense matmul FLOP/s for `dtype`: median of `repeats` (m,k)x(k,n) products on random data.

    CPU: 4096x768 @ 768x3072 (a base FFN matmul at 4K tokens); CUDA: 8192^3, large enough to fill the chip.
    """
    import statistics
    import time

    device = torch.device(device)
    m, k, n = size or ((8192, 8192, 8192) if device.type == "cuda" else (4096, 768, 3072))
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    for _ in range(3 if device.type == "cuda" else 1):
        a @ b
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2.0 * m * k * n / statistics.median(times)


def cpu_matmul_rates() -> dict[str, float]:
    """This CPU's matmul TFLOP/s in fp32 and bf16, keyed by dtype and product (machines differ several-fold, so the
    rates go beside every time measured): where bf16 is emulated (about 100x slower; `precision.native_bf16`) a
    512x768x768 product keeps its measurement short."""
    bf16_size = None if native_bf16("cpu") else (512, 768, 768)
    m, k, n = bf16_size or (4096, 768, 3072)
    return {"fp32 4096x768x3072": matmul_throughput(torch.float32) / 1e12,
            f"bf16 {m}x{k}x{n}": matmul_throughput(torch.bfloat16, size=bf16_size, repeats=3) / 1e12}


def describe_matmul_rates(rates: dict[str, float]) -> str:
    """`cpu_matmul_rates()` as one line for a results header."""
    return ", ".join(f"{name} {rate:.3f} TFLOP/s" for name, rate in rates.items())
