"""The window selector (issue 24, E7 round 15): a learned correction to each linked window's "answer here" score,
read from its [CLS] state, so that choosing among a document's windows is trained apart from reading inside one.

Why: decoding ranks a span in window w by its null-relative score z_w(t) - z_w([CLS]) + log P(end | t) (qa.py), which
splits as

    [ logsumexp_t z_w(t) - z_w([CLS]) ]  +  [ z_w(t) - logsumexp_t z_w(t) ] + log P(end | t)
      a_w: the window's answerability        the span's log-probability within the window

(t over the window's real tokens but the [CLS]), so the start head does both jobs. E7 rounds 13 and 14 trained the
ranking through it (the cross-window ranking term, windows without the answer chosen by BM25) and lowered what
ranking costs (6.0 F1 for sliding-512, 3.5-4.2 for those rows) while reading near the answer fell (80.5 to
78.4-79.6): one head paid for the other job. The selector gives the ranking a head of its own:

    a_w  =  sg( logsumexp_t z_w(t) - z_w([CLS]) )  +  u · h_w([CLS]) + b

with sg a stop-gradient, u and b zero at init (a reader with a selector reads exactly as without one, tested), and
h_w([CLS]) the window's last [CLS] state, which with linked windows has read the document's other windows in every
layer. Training: per document, one softmax over its windows' a_w plus a "no answer" option at 0, whose target is the
windows that hold the gold start (their probabilities summed: overlapping windows hold it twice), with weight
`qa_selector_weight` added to the span loss. This is the passage ranker of Wang et al. (2019, "Multi-passage BERT",
sec. 3: a ranker on [CLS] beside a globally normalised reader) and the paragraph selector of Lin et al. (2018, DS-QA),
here as a correction on top of what the reader already scores, so it starts where the reader is. The stop-gradient
keeps the selector's loss out of the span logits; it still reaches the encoder through h_w([CLS]).

Decoding adds c_w = u · h_w([CLS]) + b to the null-relative offset of every span of window w (the span's score becomes
a_w plus its log-probability within the window); the other scoring rules ignore it.

Measured (E7 round 15, docs/experiments/e7.md): the linked reader trained with the selector reads 75.6 F1 on E7's 336
test questions and 75.9 with the correction set to zero, so at decoding the head adds nothing there; it stays an
option, tested, not a default.
"""

from __future__ import annotations

import torch
from torch import nn

from .linked_windows import answer_rows, document_cross_entropy

# The selector's module name in a QA model (LongBirdForQuestionAnswering.qa_selector): conversion adds it at zero
# or drops it, and training gives it the link gates' learning rate.
SELECTOR = "qa_selector"


class WindowSelector(nn.Linear):
    """c_w = u · h_w([CLS]) + b, zero at init (LongBirdPreTrainedModel._init_weights)."""

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`hidden_states` (B, l, h), the last layer's: c (B,) in fp32, from each row's position 0."""
        return super().forward(hidden_states[:, 0]).squeeze(-1).float()


def window_selector_loss(corrections: torch.Tensor, start_logits: torch.Tensor, valid: torch.Tensor,
                         start_targets: torch.Tensor, document_ids: torch.Tensor,
                         ignore_index: int = -100) -> torch.Tensor:
    """Per document with the answer in some window: -log of the summed softmax probability of the windows holding the
    gold start, over a_w = sg(logsumexp_{t > 0, valid} z_w(t) - z_w(0)) + c_w for each of its windows and 0 ("no
    answer"). Rows with an ignored target are not options; documents without the answer add nothing; the mean is over
    the rest (module docstring).

    corrections (B,) float, the selector's c_w; start_logits (B, l); valid (B, l) bool; start_targets (B,) long
    (0: not in this window); document_ids (B,) long."""
    logits = start_logits.detach().float()
    low = torch.finfo(logits.dtype).min
    options, kept, _, answered = answer_rows(valid, start_targets, ignore_index)
    answerability = torch.logsumexp(logits.masked_fill(~options, low), -1) - logits[:, 0]  # (B,)
    scores = answerability + corrections.float()
    return document_cross_entropy(scores.masked_fill(~kept, low), scores, answered, document_ids)
