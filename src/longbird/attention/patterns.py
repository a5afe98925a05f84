"""BigBird ITC block pattern as a small object: fast code reads its block indices, tests materialise it.

Shapes in the notation of `longbird.attention`: b block size, n blocks, r random blocks per query block, H heads.
Query blocks 0 and n-1 are global (attend to every key); every middle block i attends to the global
blocks {0, n-1}, its window {i-1, i, i+1} and r random blocks drawn from the rest (BigBird ITC, Zaheer
et al. 2020 §2; KoBigBird-large keeps the same pattern).

Global blocks (`GLOBAL_BLOCKS`, the config's `global_blocks`): "itc" is the pattern above. "first-reads-source" keeps
block 0 global as keys (every query block reads it) but lets its queries read only the first `first_block_reach`
key blocks (the source model's length), and has no last global block (block n-1 is a window block like the others).
A converted QA reader keeps its question in block 0; under ITC the question's own queries read the whole 4K
document, a view its source never had, and every document token then reads a question state the source never
computed. With the question reading the span it read in the source, block 0's queries see the keys of the source's
first window (whose states are still those of the sparse layers below; docs/kobigbird.md, "Which blocks are
global").

Local windows (`LOCAL_WINDOWS`, the config's `local_windows`): "sliding" is BigBird's window {i-1, i, i+1} around each
middle block. "source-chunks" tiles the middle blocks from block 1 into chunks of c = source length / b - 1 blocks
(`chunk_blocks`), and every block of a chunk reads block 0 and its whole chunk: each chunk with block 0 is one window
of the source's length. With positions beyond the source repeating rows b..source-1 (TAPER copy from row b, period c
blocks), every chunk reads its positions in order, as the source read its window, where a sliding window wraps the
repeated positions in two of every three blocks; and blocks 1..c read exactly the source's first window (docs/
kobigbird.md, "Local windows"). The price: a token near a chunk's edge has no context across it (except block 0).

Random-block plans (`RANDOM_BLOCK_PLANS`): "seeded" draws the r blocks per (layer, n) from a seeded generator, the
same in training and inference; "transformers" is what `transformers.BigBirdModel` computes at inference (eval
mode): every random block is block 0, so block 0 is counted 1 + r times in each middle block's softmax.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import torch

from .tracing import outside_the_trace

WINDOW_BLOCKS = 3
RANDOM_BLOCK_PLANS = ("seeded", "transformers")
GLOBAL_BLOCKS = ("itc", "first-reads-source")
LOCAL_WINDOWS = ("sliding", "source-chunks")


@dataclass(frozen=True, eq=False)  # identity hash: plans are cached by object
class BigBirdPattern:
    """The block pattern for one layer at one length.

    `random_blocks` (H, m, r) long: key-block index of each random block of each middle query block (m = n-2 with a
    last global block, else n-1), -1 where there were fewer than r candidate blocks (short inputs).
    `first_block_reach`: how many key blocks query block 0 reads (0: all of them, ITC).
    `last_global`: block n-1 is global (ITC); False makes it a window block.
    `chunk_blocks`: 0 for BigBird's sliding window; c > 0 for windows of c blocks tiled from block 1 (every middle
    block reads its own chunk instead of its neighbours).
    """

    num_blocks: int
    block_size: int
    random_blocks: torch.Tensor
    first_block_reach: int = 0
    last_global: bool = True
    chunk_blocks: int = 0

    @property
    def middle_end(self) -> int:
        """One past the last middle (window) query block: n-1 under ITC, n without a last global block."""
        return self.num_blocks - 1 if self.last_global else self.num_blocks

    @property
    def first_block_keys(self) -> int:
        """How many key blocks query block 0 reads."""
        reach = self.first_block_reach
        return self.num_blocks if reach <= 0 else min(reach, self.num_blocks)

    @property
    def num_heads(self) -> int:
        return self.random_blocks.shape[0]

    @property
    def repeats_blocks(self) -> bool:
        """True when a key block is counted more than once (the transformers plan: random blocks = block 0)."""
        return self.middle_end > 1 and bool((self.random_blocks == 0).any())

    def window_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Key-block indices (m, w) of every middle query block's local window and their validity (False for a block
        past the end or a global block, which is read once as such): w = 3 (left, own, right) for a sliding window,
        w = `chunk_blocks` (the chunk, in order) for source chunks."""
        n = self.num_blocks
        window = local_window(torch.arange(1, self.middle_end), self.chunk_blocks)
        valid = (window > 0) & (window < (n - 1 if self.last_global else n))
        return window.clamp(max=n - 1), valid

    def middle_key_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Key-block indices (H, m, k) of every middle query block (m as in `random_blocks`), and a bool validity of
        the same shape: k = 2 + w + r under ITC, 1 + w + r without a last global block (w: `window_blocks`).

        Order: first global, the window, last global (ITC only), random. A window block that is also a global
        block (or lies past the end) is marked invalid so no key is counted twice.
        """
        n = self.num_blocks
        heads = self.num_heads
        middle = torch.arange(1, self.middle_end)
        window, window_valid = self.window_blocks()
        columns = [torch.zeros_like(middle)[:, None], window]
        valid_columns = [torch.ones_like(middle, dtype=torch.bool)[:, None], window_valid]
        if self.last_global:
            columns.append(torch.full_like(middle, n - 1)[:, None])
            valid_columns.append(torch.ones_like(middle, dtype=torch.bool)[:, None])
        fixed = torch.cat(columns, dim=-1)  # (m, 1 + w [+ 1])
        fixed_valid = torch.cat(valid_columns, dim=-1)
        fixed = fixed.expand(heads, -1, -1)
        fixed_valid = fixed_valid.expand(heads, -1, -1)
        random_valid = self.random_blocks >= 0
        indices = torch.cat([fixed, self.random_blocks.clamp(min=0)], dim=-1)
        valid = torch.cat([fixed_valid, random_valid], dim=-1)
        return indices, valid

    def block_counts(self) -> torch.Tensor:
        """(H, n, n) int: how many times each query block counts each key block (0 = not attended; > 1 only in the
        transformers plan, where the blocked kernel gathers block 0 once per random slot)."""
        n, heads = self.num_blocks, self.num_heads
        counts = torch.zeros(heads, n, n, dtype=torch.int32)
        counts[:, 0, :self.first_block_keys] = 1
        if self.last_global:
            counts[:, n - 1, :] = 1
        if self.middle_end > 1:
            indices, valid = self.middle_key_blocks()
            counts[:, 1:self.middle_end].scatter_add_(-1, indices, valid.to(torch.int32))
        return counts

    def block_table(self) -> torch.Tensor:
        """The pattern at block level (H, n, n) bool, True = query block may attend key block: what the flex backend
        turns into a BlockMask, and what `materialize` expands to tokens."""
        return self.block_counts() > 0

    def materialize(self) -> torch.Tensor:
        """The pattern as a dense bool mask (H, n*b, n*b), True = query may attend key. For tests/reference."""
        return self.materialize_counts() > 0

    def materialize_counts(self) -> torch.Tensor:
        """`block_counts` at token level (H, n*b, n*b): the multiplicity of each key in each query's softmax."""
        b = self.block_size
        return self.block_counts().repeat_interleave(b, dim=1).repeat_interleave(b, dim=2)


def local_window(middle: torch.Tensor, chunk_blocks: int) -> torch.Tensor:
    """(m, w) key-block indices of the local window of each query block in `middle` (unclamped: past the ends too):
    {i-1, i, i+1} for BigBird's sliding window, i's chunk of `chunk_blocks` blocks tiled from block 1 otherwise."""
    if chunk_blocks:
        start = 1 + (middle - 1) // chunk_blocks * chunk_blocks
        return start[:, None] + torch.arange(chunk_blocks, device=middle.device)
    # the offsets on middle's device: a CPU tensor added to a CUDA one fails (the device plan's compiled graph on a GPU)
    return middle[:, None] + torch.arange(-1, WINDOW_BLOCKS - 1, device=middle.device)


def _plan_seed(seed: int, layer: int, num_blocks: int) -> int:
    # A stable integer (not Python's salted hash) so plans agree across processes and runs.
    return (seed * 1_000_003 + layer * 10_007 + num_blocks) % (2**63 - 1)


@lru_cache(maxsize=256)
def bigbird_pattern(
    num_blocks: int, block_size: int, num_heads: int, num_random_blocks: int, seed: int, layer: int,
    plan: str = "seeded", first_block_reach: int = 0, last_global: bool = True, chunk_blocks: int = 0,
) -> BigBirdPattern:
    """Draw the random blocks for (layer, length) once from a seeded generator; same plan in train and eval.
    plan="transformers": every random block is block 0 (transformers' BigBird at inference).
    `first_block_reach`, `last_global`, `chunk_blocks`: the global blocks and local windows (`BigBirdPattern`;
    `pattern_arguments` maps the config's `global_blocks` and `local_windows` to them). Callers pass every argument
    positionally: lru_cache keys keyword and positional calls apart, and a second entry would be a second pattern
    object (a second plan in every cache keyed by it).

    A pure function of its ints, computed outside any trace (`tracing.outside_the_trace`): an exported graph holds
    the drawn plan as a constant and never draws it itself, whether or not this length ran eagerly before."""
    if plan not in RANDOM_BLOCK_PLANS:
        raise ValueError(f"random-block plan must be one of {RANDOM_BLOCK_PLANS}; got {plan!r}")
    with outside_the_trace():
        pattern = _draw_pattern(num_blocks, block_size, num_heads, num_random_blocks, seed, layer, plan, last_global,
                                chunk_blocks)
        return dataclasses.replace(pattern, first_block_reach=first_block_reach, last_global=last_global,
                                   chunk_blocks=chunk_blocks)


def pattern_arguments(global_blocks: str, local_windows: str, block_size: int, full_attention_max_length: int
                      ) -> tuple[int, bool, int]:
    """The config's `global_blocks` and `local_windows` (validated by the config) as `bigbird_pattern`'s last three
    arguments (first_block_reach, last_global, chunk_blocks). Passed positionally by every caller, so a pattern has
    one cache entry."""
    source_blocks = full_attention_max_length // block_size
    chunk_blocks = source_blocks - 1 if local_windows == "source-chunks" else 0
    if global_blocks == "itc":
        return 0, True, chunk_blocks
    return source_blocks, False, chunk_blocks


def _draw_pattern(n: int, block_size: int, num_heads: int, r: int, seed: int, layer: int, plan: str,
                  last_global: bool = True, chunk_blocks: int = 0) -> BigBirdPattern:
    # BigBird's random blocks (Zaheer et al. 2020, §2 and App. D): r key blocks per middle query block and head, drawn
    # from the blocks that are neither global nor in the window.
    end = n - 1 if last_global else n  # one past the last middle query block
    middle = max(end - 1, 0)
    if middle == 0 or r == 0:
        return BigBirdPattern(n, block_size, torch.full((num_heads, middle, r), -1, dtype=torch.long))
    if plan == "transformers":
        return BigBirdPattern(n, block_size, torch.zeros((num_heads, middle, r), dtype=torch.long))
    generator = torch.Generator().manual_seed(_plan_seed(seed, layer, n))
    keys = torch.rand(num_heads, middle, n, generator=generator)
    cols = torch.arange(n)[None, :]
    in_window = (local_window(torch.arange(1, end), chunk_blocks)[:, :, None] == cols[:, None, :]).any(1)
    excluded = (cols == 0) | ((cols == n - 1) & last_global) | in_window  # global + window blocks
    keys = keys.masked_fill(excluded, float("inf"))
    take = min(r, n)
    chosen_keys, chosen = keys.topk(take, dim=-1, largest=False)
    chosen = chosen.masked_fill(chosen_keys.isinf(), -1)
    if take < r:
        chosen = torch.cat([chosen, chosen.new_full((num_heads, middle, r - take), -1)], dim=-1)
    return BigBirdPattern(n, block_size, chosen)


def sliding_window_blocks(num_blocks: int, device=None) -> torch.Tensor:
    """LittleBird's X-to-X pattern at block level (n, n) bool: every query block attends to the first block (global
    keys) and to its own, left and right blocks (LittleBird §3.2-3.3)."""
    block = torch.arange(num_blocks, device=device)
    return ((block[:, None] - block[None, :]).abs() <= 1) | (block[None, :] == 0)


def sliding_window_mask(num_blocks: int, block_size: int) -> torch.Tensor:
    """The same pattern as a dense bool (l, l) mask. For tests/reference."""
    return sliding_window_blocks(num_blocks).repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)
