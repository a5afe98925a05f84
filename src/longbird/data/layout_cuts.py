"""Short training windows cut from a long reader's own layout (issue 24, E7 round 8).

Why: a long reader trained on whole articles sees one question per pass over the article, so at an equal CPU budget
a sliding 512-token reader is supervised on about 9 times as many questions (E7 rounds 1 and 5); and a sliding reader
converted to a long one afterwards loses beyond 512 tokens what its training bought (round 6), because a token there
is read with copied positions (TAPER `copy`) and regional nulls it never saw in training. A cut costs what a sliding
window costs and shows every token as the long reading does.

A long window (question, document tokens and, with `config.qa_null_every`, regional nulls: data/null_regions.py) of
L tokens becomes windows of `length` tokens: its first `head` tokens (the global block: [CLS], the question and the
first document tokens, which every token of the long window reads) followed by a span of `length - head` consecutive
tokens. Every token keeps its long-window position id and its long-window null, so a cut reads its positions as the
long reading does. With the round-4 long reader (block 128, the question block global, no random blocks) a token
of a 384-token span sees in its cut about what block-sparse attention shows it in the whole article: the question
block and its neighbourhood (there three 128-token blocks on the block grid, here the span, which starts on a null
and so is not aligned with that grid; near the span's ends it sees less). A span
starts inside the first region (whose null is [CLS], in the head) or at a null, so every token's null lies in its
cut. Consecutive spans overlap by about `overlap` tokens: the next start is the allowed one nearest to the previous
start + span - overlap (a null every 129 tokens lies within 64 of it). A long window of at most `length` tokens is
one cut, the window itself.

Labels: a cut holding the whole gold span is labelled with it; any other is a negative (target 0, the [CLS]; with
regional nulls every region then targets its own null, region_losses.py `regional_start_loss`), kept with probability
`negative_fraction`, drawn before anything is built. An answer that starts in the head would be in every cut of its
window: it labels the first cut only, and the window's other cuts are left out (they are not negatives).

What a cut does not reproduce: a cut of at most `full_attention_max_length` tokens is read with full attention, so
its head's queries read the span; in the long reading of a `global_blocks="first-reads-source"` reader they read
the first 512 tokens only. The head's states, which every token reads, are thus trained in another context than
the one they are read in.
"""

from __future__ import annotations

import random

import numpy as np

from .windows import QAWindows


def span_starts(length: int, head: int, span: int, overlap: int, first_region: int, nulls: np.ndarray) -> list[int]:
    """The first token of every cut's span in a long window of `length` tokens: allowed starts are head..
    first_region-1 and the nulls; each next start is, among the allowed ones after the previous start and no later
    than the previous span's end (so no token is skipped), the one nearest to the previous + span - overlap (ties:
    the earlier); the last span reaches the end."""
    allowed = np.concatenate([np.arange(head, min(first_region, length), dtype=np.int64), nulls])
    starts = [head]
    while starts[-1] + span < length:
        previous = starts[-1]
        reach = allowed[(allowed > previous) & (allowed <= previous + span)]
        if not len(reach):
            raise ValueError(f"a cut's span of {span} tokens does not reach the next regional null after token "
                             f"{previous}: cut windows must hold the first block and more than one region "
                             "(qa_null_every + 1 tokens); use longer cuts")
        aim = previous + span - overlap
        starts.append(int(reach[np.argmin(np.abs(reach - aim))]))
    return starts


class LayoutCuts:
    """Training items of `length` tokens cut from the long windows of `windows` (a `QAWindows` built with
    `negative_fraction=1.0`, its nulls in, if any): item i is {"input_ids", "attention_mask", "position_ids"
    [, "region_nulls", "token_type_ids"], "start_positions", "end_positions"}, the long window's tokens at the cut's
    indices with their long-window positions and nulls. `windows` counts the cuts before the negative draw."""

    def __init__(self, windows: QAWindows, length: int, head: int, overlap: int, negative_fraction: float = 1.0,
                 seed: int = 0):
        if not 0 < head < length:
            raise ValueError(f"a cut of {length} tokens cannot start with a head of {head} tokens: the head (the "
                             "question block) must be shorter than the cut")
        if not 0 <= overlap < length - head:
            raise ValueError(f"cuts overlap by {overlap} tokens but hold only {length - head} after the head: use an "
                             f"overlap in 0..{length - head - 1}")
        self.long, self.length, self.head, self.span = windows, length, head, length - head
        regions = windows.null_regions
        template = windows.template
        rng = random.Random(seed)
        items, self.windows = [], 0
        for index, (question, _, doc_start, doc_stop, first, last) in enumerate(windows.items.tolist()):
            question_end = len(template.prefix) + len(windows.questions[question])
            if question_end > head:
                raise ValueError(f"a question of {len(windows.questions[question])} tokens does not fit the first "
                                 f"{head} tokens every cut keeps: cut the questions shorter (max_question_tokens) or "
                                 "train on whole windows")
            before = question_end + len(template.middle)
            size = before + doc_stop - doc_start + len(template.suffix)
            nulls = np.zeros(0, dtype=np.int64)
            first_region = size
            if regions is not None:
                nulls = regions.null_indices((before, before + doc_stop - doc_start))
                first_region = regions.after
                size += len(nulls)
                # a labelled token moves by the nulls inserted before it or right before it (`preceded`: the token
                # each null goes before, indexed before insertion)
                preceded = nulls - np.arange(len(nulls))
                if first:
                    first, last = (int(i + np.searchsorted(preceded, i, side="right")) for i in (first, last))
            if size <= length:
                self.windows += 1
                if first or rng.random() < negative_fraction:
                    items.append((index, -1, first, last, size))
                continue
            for start in span_starts(size, head, self.span, overlap, first_region, nulls):
                if 0 < first < head and start != head:
                    # an answer in the head is in every cut of its window: labelled in the first cut only (the
                    # others would repeat one question many times), and the others are no negatives either
                    continue
                self.windows += 1
                inside = first > 0 and (first >= start or start == head) and last < start + self.span
                if not inside and rng.random() >= negative_fraction:
                    continue
                cut_first, cut_last = ((_cut_index(first, head, start), _cut_index(last, head, start)) if inside
                                       else (0, 0))
                items.append((index, start, cut_first, cut_last, head + min(self.span, size - start)))
        # per cut: (long window, span start or -1 for the whole window, start label, end label, tokens)
        self.items = np.asarray(items, dtype=np.int64).reshape(-1, 5)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        long_index, start, first, last, _ = (int(x) for x in self.items[index])
        item = self.long[long_index]
        size = len(item["input_ids"])
        item.setdefault("position_ids", list(range(size)))
        if start < 0:
            return item
        keep = [*range(self.head), *range(start, min(start + self.span, size))]
        cut = {key: [item[key][i] for i in keep] for key in ("input_ids", "attention_mask", "position_ids",
                                                               "token_type_ids") if key in item}
        if "region_nulls" in item:  # a token's null is in the head ([CLS]) or in the span (a span starts at a null)
            cut["region_nulls"] = [_cut_index(item["region_nulls"][i], self.head, start) for i in keep]
        return {**cut, "start_positions": first, "end_positions": last}

    def lengths(self) -> list[int]:
        """Tokens of every item (for length-grouped batches), without building the items."""
        return self.items[:, 4].tolist()


def _cut_index(index: int, head: int, start: int) -> int:
    """Where long-window token `index` (in the head or in the span starting at `start`) lands in the cut."""
    return index if index < head else head + index - start
