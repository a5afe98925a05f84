"""Fused attention kernels for x86 CPUs, built on first use: bf16 and fp32 with AVX-512
(`kernels/block_attention_bf16.cpp`, `block_attention_fp32.cpp`), fp32 with AVX2 and FMA
(`kernels/block_attention_fp32_avx2.cpp`) on CPUs without AVX-512.

Why kernels of our own: at the head size longbird serves (multilingual-e5-small, 32) PyTorch's CPU flash kernel
spends most of a BigBird forward's attention on small products and bookkeeping, not arithmetic, and neither it nor
compiled flex comes near this CPU's rate (docs/benchmarks.md, "A fused bf16 attention kernel", "The fused kernel
in fp32" and "The fused kernel on AVX2 CPUs"). The bf16 kernel computes scores with bf16 pair dot products summed
in fp32 (as SDPA's bf16 kernel), the fp32 kernels with fp32 products; all take the softmax in fp32 and read each
query group's key blocks in place through offset tables, so BigBird's gathered copies of key and value blocks are
not made.

Each instruction set's shared library (`LIBRARIES`: the AVX-512 one holds the bf16 and the fp32 kernel, the AVX2 one
the fp32 kernel under the same function names) is compiled once per machine with the system's C++ compiler (`$CXX`,
else `g++`) into `kernels/` of longbird's cache directory (`$LONGBIRD_KERNEL_CACHE`), named by a hash of its sources
and flags, written to a temporary file and renamed. A kernel is used only for CPU inference (no autograd, no
dropout, not while traced): bf16 on CPUs with AVX-512 BF16; fp32 with the AVX-512 kernel on CPUs with AVX-512, else
with the AVX2 kernel on CPUs with AVX2 and FMA. Everywhere else (fp16, GPUs, other CPUs, no compiler, or
`LONGBIRD_CPU_KERNEL=0`) the callers run SDPA as before; `LONGBIRD_CPU_KERNEL=avx2` takes the AVX2 kernel for fp32
even where AVX-512 exists (and SDPA for bf16), which is how its tests run on AVX-512 machines. A failed build is
logged once and the process falls back to SDPA.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .tracing import exporting, is_tracing

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
HEADERS = (KERNELS / "block_attention_common.h", KERNELS / "block_attention_groups.h")
COMPILE_FLAGS = ("-std=c++17", "-O3")
LINK_FLAGS = ("-fopenmp", "-shared", "-fPIC")


@dataclass(frozen=True)
class Library:
    """One shared library of kernels: its sources, the instruction-set flags they are compiled with and the dtypes
    whose kernels it holds (functions `longbird_block_attention_{bf16,fp32}`, `longbird_pack_blocks_{...}`)."""

    sources: tuple[Path, ...]
    flags: tuple[str, ...]
    dtypes: tuple[str, ...]


LIBRARIES = {
    "avx512": Library((KERNELS / "block_attention_bf16.cpp", KERNELS / "block_attention_fp32.cpp"),
                      ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"),
                      ("bf16", "fp32")),
    "avx2": Library((KERNELS / "block_attention_fp32_avx2.cpp",), ("-mavx2", "-mfma"), ("fp32",)),
}
MAX_HEAD_DIM = 128   # query/key width the kernels accept (the bf16 kernel's per-row pair buffer)
MAX_VALUE_DIM = 64   # value width: four rows × dv/16 fp32 accumulators must fit AVX-512's 32 vector registers
KERNEL_DTYPES = (torch.bfloat16, torch.float32)
_lock = threading.Lock()


OFF = {"0", "false", "no", "off"}


def _profiled(name: str):
    """A torch.profiler range named `name` around a kernel call while a profiler records, else nothing: a `ctypes`
    call is not an operator, so without it the kernels' time is missing from every operator table (`benchmarks/
    floor.py --profile`) and shows only as the gap between the listed operators and the forward."""
    if torch.autograd._profiler_enabled():  # the C++ profiler state: any way a profiler was started
        return torch.profiler.record_function(name)
    return nullcontext()


def _setting() -> str:
    return os.environ.get("LONGBIRD_CPU_KERNEL", "1").strip().lower()


def enabled_by_environment() -> bool:
    """False when LONGBIRD_CPU_KERNEL=0 (or "false"/"no"/"off"): SDPA everywhere, as before the kernel."""
    return _setting() not in OFF


def _cpu_has_fma() -> bool:
    """FMA3, which the AVX2 kernel multiplies with: from /proc/cpuinfo where there is one (every AVX2 CPU made so
    far has it; torch reports AVX2 but not FMA)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    flags = next((line.split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is None or "fma" in flags


@lru_cache(maxsize=4)
def cpu_instruction_sets(dtype: torch.dtype = torch.bfloat16) -> tuple[str, ...]:
    """The libraries (`LIBRARIES` keys) whose kernel for `dtype` this CPU executes, fastest first: AVX-512 BF16
    (vdpbf16ps) for bf16; AVX-512, then AVX2 with FMA, for fp32."""
    if dtype == torch.bfloat16:
        return ("avx512",) if torch.cpu._is_avx512_bf16_supported() else ()
    if dtype != torch.float32:
        return ()
    sets = ("avx512",) if torch.cpu._is_avx512_supported() else ()
    return sets + (("avx2",) if torch.cpu._is_avx2_supported() and _cpu_has_fma() else ())


def cpu_supports_kernel(dtype: torch.dtype = torch.bfloat16) -> bool:
    """The CPU executes a kernel for `dtype`: AVX-512 BF16 for bf16, AVX-512 or AVX2 with FMA for fp32."""
    return bool(cpu_instruction_sets(dtype))


def instruction_set(dtype: torch.dtype = torch.bfloat16) -> str | None:
    """The library whose kernel runs `dtype` here, by the CPU and LONGBIRD_CPU_KERNEL (0: none; avx2: the AVX2
    kernel only); None: SDPA."""
    setting = _setting()
    if setting in OFF:
        return None
    sets = cpu_instruction_sets(dtype)
    if setting == "avx2":
        sets = tuple(name for name in sets if name == "avx2")
    return sets[0] if sets else None


def cache_dir() -> Path:
    """$LONGBIRD_KERNEL_CACHE, else `kernels/` in longbird's cache directory ($LONGBIRD_CACHE, else
    $XDG_CACHE_HOME/longbird, else ~/.cache/longbird, as `sources.cache_root`), so one setting moves both; the rule is
    repeated here because this package imports only torch and the standard library. Unlike `cache_root` it has no
    temporary fallback: a directory that cannot be created fails the build, and the process keeps SDPA."""
    if os.environ.get("LONGBIRD_KERNEL_CACHE"):
        return Path(os.environ["LONGBIRD_KERNEL_CACHE"])
    if os.environ.get("LONGBIRD_CACHE"):
        return Path(os.environ["LONGBIRD_CACHE"]) / "kernels"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longbird" / "kernels"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def _flags(name: str) -> tuple[str, ...]:
    return (*COMPILE_FLAGS, *LIBRARIES[name].flags, *LINK_FLAGS)


def library_path(name: str = "avx512") -> Path:
    """Where library `name` lives: named by the hash of its sources, the shared headers, flags and compiler."""
    text = b"".join(path.read_bytes() for path in LIBRARIES[name].sources + HEADERS)
    digest = hashlib.sha256(text + " ".join(_flags(name)).encode() + str(compiler()).encode()).hexdigest()
    return cache_dir() / f"block_attention_{name}-{digest[:16]}.so"


def build(path: Path, name: str = "avx512") -> None:
    """Compile library `name` to `path` (temporary file + rename: a concurrent or killed build never leaves half a
    file)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"no C++ compiler: install g++ or set CXX (looked for {os.environ.get('CXX', 'g++')!r})")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(handle)
    try:
        result = subprocess.run([cxx, *_flags(name), *map(str, LIBRARIES[name].sources), "-o", temporary],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CPU attention kernels failed:\n{result.stderr[-2000:]}")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


@lru_cache(maxsize=len(LIBRARIES))
def _load(name: str = "avx512") -> ctypes.CDLL | None:
    with _lock:
        try:
            path = library_path(name)
            if not path.exists():
                build(path, name)
            library = ctypes.CDLL(str(path))
        except (OSError, RuntimeError) as error:
            logger.warning("the fused CPU attention kernels are unavailable, SDPA is used instead: %s", error)
            return None
    for suffix in LIBRARIES[name].dtypes:
        function = getattr(library, f"longbird_block_attention_{suffix}")
        function.restype = ctypes.c_int
        function.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] +
                             [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64] * 2 +
                             [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4 +
                             [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                              ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 4)
        pack = getattr(library, f"longbird_pack_blocks_{suffix}")
        pack.restype = ctypes.c_int
        pack.argtypes = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64] * 2 + [ctypes.c_int64] * 4 +
                         [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int])
    return library


def _library_for(dtype: torch.dtype) -> ctypes.CDLL | None:
    name = instruction_set(dtype)
    return None if name is None else _load(name)


def _suffix(dtype: torch.dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """A kernel for `dtype` can run here: enabled, the CPU has its instructions (`instruction_set`), and its library
    built (or was built before)."""
    return _library_for(dtype) is not None


def _call_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """CPU inference in bf16 or fp32 (nothing to differentiate, no dropout) at widths the kernel takes."""
    if query.device.type != "cpu" or dropout_p > 0.0:
        return False
    if query.dtype not in KERNEL_DTYPES or any(x.dtype != query.dtype for x in (key, value)):
        return False
    if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key, value)):
        return False
    return _widths_fit(query.shape[-1], value.shape[-1], query.dtype)


def _widths_fit(dim: int, value_dim: int, dtype: torch.dtype) -> bool:
    """Query/key width `dim` and value width `value_dim` are within the kernel's range for `dtype`."""
    odd = dim % 2 and dtype == torch.bfloat16  # the bf16 kernel reads q and k as pairs
    return not (odd or dim > MAX_HEAD_DIM or value_dim % 16 or value_dim > MAX_VALUE_DIM)


def takes_head_size(head_size: int, dtype: torch.dtype) -> bool:
    """Heads of this width (queries, keys and values alike) are within the kernel's range for `dtype`."""
    return dtype in KERNEL_DTYPES and _widths_fit(head_size, head_size, dtype)


def usable(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0) -> bool:
    """This eager call may take the kernel: not traced, and `_call_fits`."""
    return not is_tracing() and _call_fits(query, key, value, dropout_p) and available(query.dtype)


@torch.compiler.assume_constant_result
def _bf16_available_to_compiled_graphs() -> bool:
    return available(torch.bfloat16)


@torch.compiler.assume_constant_result
def _fp32_available_to_compiled_graphs() -> bool:
    return available(torch.float32)


def available_to_compiled_graphs(dtype: torch.dtype = torch.bfloat16) -> bool:
    """`available(dtype)`, read once while torch.compile traces a graph and kept in it as a constant."""
    if dtype == torch.bfloat16:
        return _bf16_available_to_compiled_graphs()
    return _fp32_available_to_compiled_graphs()


def usable_in_compiled_graph(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             dropout_p: float = 0.0) -> bool:
    """While torch.compile traces (not torch.export or torch.jit: their graphs must run elsewhere), the same
    conditions as `usable`; the caller then puts the kernel in the graph as an opaque op."""
    if not torch.compiler.is_compiling() or exporting() or torch.jit.is_tracing():
        return False
    return _call_fits(query, key, value, dropout_p) and available_to_compiled_graphs(query.dtype)


def token_offsets(strides, batch: int, heads: int, tokens: torch.Tensor) -> torch.Tensor:
    """(B, H, *tokens.shape[1:]) element offsets of token `tokens[h, ...]` (or `tokens[0, ...]` for every head) of
    row b, head h in a (B, H, l, ·) tensor of these strides: the offset tables every caller of `attend_blocks`
    builds. Strides such as (l, 0, 1) address a (B, l) mask; (H·n, n, 1) index (row, head, block)-ordered blocks."""
    rest = [1] * (tokens.dim() - 1)
    b = torch.arange(batch).view(batch, 1, *rest)
    h = torch.arange(heads).view(1, heads, *rest)
    return b * strides[0] + h * strides[1] + tokens[None] * strides[2]


def packed_units(dtype: torch.dtype, dim: int, value_dim: int, block_rows: int) -> tuple[int, int]:
    """Elements of one packed key block and one packed value block in `pack_blocks`' output for `dtype`: block i of
    the key tensor starts at i times the first, of the value tensor at i times the second."""
    if dtype == torch.bfloat16:
        return dim // 2 * block_rows, block_rows // 2 * value_dim  # int32 elements, each a bf16 pair
    return dim * block_rows, block_rows * value_dim


def pack_blocks(key: torch.Tensor, key_offsets: torch.Tensor, value: torch.Tensor, value_offsets: torch.Tensor,
                block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value blocks (block i's first row at element offset `key_offsets[i]` / `value_offsets[i]`, tokens
    `stride(-2)` apart) packed as the kernel reads them, for `attend_blocks(..., packed=True)`: bf16 as int32
    tensors of bf16 pairs, (nblocks, d/2, block_rows) and (nblocks, block_rows/2, d_v); fp32 as (nblocks, d,
    block_rows) keys (transposed; the AVX2 kernel orders each block's floats in chunks of 16 keys) and (nblocks,
    block_rows, d_v) values (AVX2: in runs of 16 columns). Offsets: `packed_units`."""
    blocks, dim, value_dim = key_offsets.numel(), key.shape[-1], value.shape[-1]
    dtype = key.dtype
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype not in KERNEL_DTYPES or tensor.dtype != dtype or tensor.stride(-1) != 1:
            raise ValueError(f"pack_blocks: {name} must be bf16 or fp32 (both alike) with a contiguous last dimension")
    if dtype == torch.bfloat16:
        key_packed = torch.empty(blocks, dim // 2, block_rows, dtype=torch.int32)
        value_packed = torch.empty(blocks, block_rows // 2, value_dim, dtype=torch.int32)
    else:
        key_packed = torch.empty(blocks, dim, block_rows, dtype=torch.float32)
        value_packed = torch.empty(blocks, block_rows, value_dim, dtype=torch.float32)
    key_offsets, value_offsets = key_offsets.contiguous(), value_offsets.contiguous()
    name = f"longbird_pack_blocks_{_suffix(dtype)}"
    with _profiled(name):
        status = getattr(_library_for(dtype), name)(
            key.data_ptr(), key_offsets.data_ptr(), key.stride(-2), value.data_ptr(), value_offsets.data_ptr(),
            value.stride(-2), blocks, block_rows, dim, value_dim, key_packed.data_ptr(), value_packed.data_ptr(),
            torch.get_num_threads())
    if status:
        raise ValueError(f"pack_blocks: block rows ({block_rows}) and head size ({dim}) must be even, and for the "
                         "AVX2 kernel block rows and value width multiples of 16")
    return key_packed, value_packed


def attend_blocks(query: torch.Tensor, query_offsets: torch.Tensor, query_rows: int,
                  key: torch.Tensor, key_offsets: torch.Tensor, value: torch.Tensor, value_offsets: torch.Tensor,
                  mask: torch.Tensor, mask_offsets: torch.Tensor, block_rows: int,
                  out: torch.Tensor, out_offsets: torch.Tensor, scale: float, packed: bool = False,
                  bialibi: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Run the kernel over G query groups, writing into `out`.

    query/key/value/out: bf16 or fp32 tensors (one dtype) whose last dimension is contiguous and whose tokens are
    `stride(-2)` apart;
    the offsets are element offsets into them (int64, contiguous): `query_offsets`/`out_offsets` (G,) the first row
    of each group's `query_rows` rows; `key_offsets`/`value_offsets` (G, nkb) the first row of each of the group's key
    blocks of `block_rows` rows; `mask` uint8 (1 = may attend) with `mask_offsets` (G, nkb) into it (-1: the whole
    block is masked). `packed=True`: key and value are `pack_blocks`' tensors and their offsets index its
    elements (block i at i times `packed_units`); block_rows must be a multiple of 32, and `dim` is then the
    query's. `bialibi` (LittleBird): (slopes (G, 4) fp32 [α, β, γ, D_C] of each group's head,
    positions int64, query position offsets (G,), key position offsets (G, nkb), -1 for a block of packed-context
    keys): the kernel subtracts the BiALiBi distance from every score. The caller keeps every offset inside its
    tensor."""
    groups, blocks = key_offsets.shape
    dtype = query.dtype
    library = _library_for(dtype)
    tensors = (("query", query), ("out", out)) + (() if packed else (("key", key), ("value", value)))
    for name, tensor in tensors:
        if dtype not in KERNEL_DTYPES or tensor.dtype != dtype or tensor.stride(-1) != 1:
            raise ValueError(f"attend_blocks: {name} must be bf16 or fp32, as the query, with a contiguous last "
                             "dimension")
    packed_dtype = torch.int32 if dtype == torch.bfloat16 else torch.float32
    if packed and (key.dtype != packed_dtype or value.dtype != packed_dtype or block_rows % 32):
        raise ValueError("attend_blocks: packed keys and values come from pack_blocks (of the query's dtype), in "
                         "blocks of a multiple of 32")
    tables = [t.contiguous() for t in (query_offsets, key_offsets, value_offsets, mask_offsets, out_offsets)]
    if any(t.dtype != torch.int64 for t in tables):
        raise ValueError("attend_blocks: offset tables must be int64")
    mask = mask.contiguous()
    extra = [None] * 4
    if bialibi is not None:
        extra = [t.contiguous() for t in bialibi]
        if extra[0].dtype != torch.float32 or any(t.dtype != torch.int64 for t in extra[1:]):
            raise ValueError("attend_blocks: BiALiBi slopes are fp32, positions and their offsets int64")
    name = f"longbird_block_attention_{_suffix(dtype)}"
    with _profiled(name):
        status = getattr(library, name)(
            query.data_ptr(), tables[0].data_ptr(), query.stride(-2), query_rows,
            key.data_ptr(), tables[1].data_ptr(), key.stride(-2),
            value.data_ptr(), tables[2].data_ptr(), value.stride(-2),
            mask.data_ptr(), tables[3].data_ptr(),
            blocks, block_rows, query.shape[-1], out.shape[-1],
            out.data_ptr(), tables[4].data_ptr(), out.stride(-2),
            groups, float(scale), int(packed), torch.get_num_threads(),
            *(None if t is None else t.data_ptr() for t in extra))
    if status == 1:
        raise ValueError("attend_blocks: shapes outside the kernel's range (see usable())")
    if status:
        raise MemoryError("attend_blocks: the kernel could not allocate its per-thread buffers")
    return out
