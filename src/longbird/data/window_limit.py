"""How many windows one document makes, and a limit on them checked before any is built.

Overlapping windows of `room` document tokens whose neighbours share `stride` tokens start `room - stride` tokens
apart (the tokenizer's overflowing windows). A stride close to the window moves each window on by a few tokens, so
one document of a million characters would become hundreds of thousands of windows: hours on a server's one model
thread and gigabytes of token lists before the first forward. Readers that take strides from strangers (the HTTP
server) pass a `window_limit`; the windows are counted from the document's token count first, and a document over
the limit is refused (`TooManyWindows`, which the server answers with 413) before the windows are built.
"""

from __future__ import annotations


class TooManyWindows(ValueError):
    """A document whose windows at the requested stride exceed a reader's window limit."""


def window_count(tokens: int, room: int, stride: int) -> int:
    """Windows of `room` document tokens, neighbours sharing `stride` (< room), over `tokens` document tokens."""
    if not 0 <= stride < room:
        raise ValueError(f"stride ({stride}) must lie in 0..{room - 1} for windows of {room} document tokens")
    return 1 if tokens <= room else 1 + -(-(tokens - room) // (room - stride))


def check_window_limit(tokenizer, text: str, max_length: int, room: int, stride: int, window_limit: int) -> int:
    """The windows `text` makes (`max_length` tokens each, holding `room` tokens of it, neighbours sharing `stride`);
    TooManyWindows when they are more than `window_limit`."""
    tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    windows = window_count(tokens, room, stride)
    if windows > window_limit:
        raise TooManyWindows(f"the document's {tokens:,} tokens make {windows:,} windows of {max_length} tokens at a "
                             f"stride of {stride} (each window moves on by {room - stride} tokens), more than the "
                             f"{window_limit:,} this reader reads for one request; send a smaller stride, longer "
                             f"windows or a shorter document")
    return windows
