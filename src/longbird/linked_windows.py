"""Linked windows (issue 24, E7 round 13): the sliding windows of one document read in one batch, whose [CLS] states
read each other's in every layer.

Why: twelve E7 rounds of long layouts (copied positions past the source length, regional nulls, block-sparse
attention) lost to sliding 512-token windows of their own source, and round 10 measured why: the long layout itself
costs about 6 F1 near the answer before any training, where the answer's neighbourhood passes the source's window.
Sliding windows never pay that (each window is what the source was trained on), but they are read apart, so a span is
ranked against spans of other windows by scores no window could compare: ranking the article's places costs the
sliding reader about 6 F1 at 30 CPU minutes (round 9). Linked windows keep every window exactly as the source reads it
and add the one thing a window lacks, the other windows: after layer l, each window's [CLS] state gets

    h_cls(w) ← h_cls(w) + g_l · O_l( Σ_{w' ≠ w, same document} softmax_w'( q_l(w)·k_l(w') / √d ) v_l(w') )

per head, where q_l, k_l, v_l and O_l are layer l's own attention projections (the [CLS] attends to the other windows'
[CLS] states as BigBird's global tokens attend to each other; no new matrices), and g_l is a scalar gate per layer,
zero at init. So a converted or fine-tuned reader with links reads exactly as without them until training moves the
gates (tests/test_linked_windows.py checks bit-equality at g = 0), and the gradient of the loss with respect to g_l is
not zero there (it is the [CLS] state's gradient dotted with the exchange). The [CLS] is each window's null, so the
exchange can lower the null-relative scores of a window whose text the other windows read better; the tokens of a
window read the exchanged [CLS] in the next layer.

Training (`cross_window_ranking_loss`): each window keeps the sliding reader's own start loss (its softmax, its [CLS]
as "not here"), and, with `qa_ranking_weight` w, (1 - w) of it is mixed with one softmax over the null-relative start
scores of every window of the document, z_w(t) - z_w([CLS]), plus a "no answer" option at 0, whose target is the
gold start in the windows that hold it (log-sum-exp over them: overlapping windows hold it twice). That is the
ranking decoding does (`qa.py`: spans across windows by null-relative scores), trained as E7 round 10's
`cross_region_ranking_loss` trains it across the regions of one long window.

`document_ids` (B,) long names each row's document: rows with the same id are linked; rows of other documents never
influence a row (a batch of several documents reads each as if alone). Without `document_ids`, no row is linked.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# The gates' parameter name in a model's state dict (the encoder holds WindowLinks as `links`): conversion adds or
# drops it, and training gives it its own learning rate.
GATES = "links.gates"


class WindowLinks(nn.Module):
    """The gates g_l (one per layer, zero at init) and the exchange between the [CLS] states of linked rows."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.gates = nn.Parameter(torch.zeros(num_layers))

    def forward(self, index: int, layer: nn.Module, hidden_states: torch.Tensor,
                document_ids: torch.Tensor) -> torch.Tensor:
        """`hidden_states` (B, l, h) after layer `index` (`layer`, a LongBirdLayer); returns them with each row's
        position 0 updated by the gated exchange with the other rows of its document."""
        attention = layer.attention.self
        batch = hidden_states.shape[0]
        cls = hidden_states[:, 0]  # (B, h)
        heads, size = attention.num_heads, attention.head_dim
        query, key, value = (projection(cls).view(batch, heads, size).transpose(0, 1)  # (H, B, d)
                             for projection in (attention.query, attention.key, attention.value))
        linked = linked_rows(document_ids)  # (B, B): same document, not itself
        scores = (query @ key.transpose(1, 2)).float() / math.sqrt(size)  # (H, B, B), softmax in fp32
        # A row with no linked row gets weights of 0 everywhere (not a softmax over -inf, whose backward is NaN).
        weights = torch.softmax(scores.masked_fill(~linked, torch.finfo(scores.dtype).min), -1) * linked
        context = (weights.to(value.dtype) @ value).transpose(0, 1).reshape(batch, heads * size)  # (B, h)
        # O_l's bias would move a row that read nothing: a row with no linked row is left exactly as it was
        exchanged = layer.attention.output.dense(context) * linked.any(-1, keepdim=True)
        update = self.gates[index].to(hidden_states.dtype) * exchanged.to(hidden_states.dtype)
        return torch.cat([hidden_states[:, :1] + update[:, None], hidden_states[:, 1:]], dim=1)


def linked_rows(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, B) bool: row i reads row j (same document id, j ≠ i)."""
    same = document_ids[:, None] == document_ids[None, :]
    return same & ~torch.eye(len(document_ids), dtype=torch.bool, device=document_ids.device)


def cross_window_ranking_loss(start_logits: torch.Tensor, valid: torch.Tensor, start_targets: torch.Tensor,
                              document_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """One softmax per document over the null-relative start scores z(t) - z([CLS]) of every real token of every one
    of its windows (position 0, each window's [CLS], is the window's null and not an option), plus a "no answer"
    option at 0; the target is the gold start in each window that holds it (their probabilities summed). Documents
    with the answer in none of their windows add nothing; the mean is over the rest (module docstring).

    start_logits (B, l); valid (B, l) bool; start_targets (B,) long (0: not in this window; `ignore_index`: ignored);
    document_ids (B,) long."""
    logits = start_logits.float()
    low = torch.finfo(logits.dtype).min
    relative = logits - logits[:, :1]
    options, _, target, answered = answer_rows(valid, start_targets, ignore_index)
    row_all = torch.logsumexp(relative.masked_fill(~options, low), -1)  # (B,)
    row_gold = relative.gather(1, target[:, None]).squeeze(1)
    return document_cross_entropy(row_all, row_gold, answered, document_ids)


def answer_rows(valid: torch.Tensor, start_targets: torch.Tensor, ignore_index: int):
    """(options (B, l): the real tokens but each row's [CLS], kept (B,): rows whose target is not ignored, target (B,):
    the gold start, 0 where none, answered (B,): kept rows whose gold start is one of their options)."""
    options = valid.clone()
    options[:, 0] = False
    kept = start_targets != ignore_index
    target = start_targets.clamp(min=0)
    answered = kept & (target > 0) & options.gather(1, target[:, None]).squeeze(1)
    return options, kept, target, answered


def document_cross_entropy(row_all: torch.Tensor, row_gold: torch.Tensor, answered: torch.Tensor,
                           document_ids: torch.Tensor) -> torch.Tensor:
    """One softmax per document over what its rows offer plus a "no answer" option at 0: -log of the gold part.
    row_all (B,) fp32: log-sum-exp of each row's options (the dtype's lowest value for a row offering none);
    row_gold (B,): each answered row's gold score; answered (B,) bool. Documents with no answered row add nothing;
    the mean is over the rest (`cross_window_ranking_loss`, window_selector.py)."""
    low = torch.finfo(row_all.dtype).min
    documents, inverse = torch.unique(document_ids, return_inverse=True)
    member = inverse[None, :] == torch.arange(len(documents), device=inverse.device)[:, None]  # (D, B)
    no_answer = row_all.new_zeros(len(documents), 1)
    every = torch.logsumexp(torch.cat([row_all[None].masked_fill(~member, low), no_answer], -1), -1)
    gold = torch.logsumexp(row_gold[None].masked_fill(~(member & answered[None]), low), -1)
    has_answer = (member & answered[None]).any(-1)
    loss = torch.where(has_answer, every - gold, torch.zeros_like(every))
    return loss.sum() / has_answer.sum().clamp(min=1)
