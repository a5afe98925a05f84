"""Task heads on LongBirdModel: masked LM, sequence classification, extractive QA with a
start-then-conditional-end head (LittleBird A.2), and Recurring Span Selection for pretraining (training/rss.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    MaskedLMOutput,
    ModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
)
from transformers.utils.generic import can_return_tuple

from .config import LongBirdConfig
from .data.null_regions import NullRegions
from .linked_windows import cross_window_ranking_loss
from .modeling import LongBirdModel, LongBirdPreTrainedModel, refuse_attention_maps
from .region_losses import IGNORE_INDEX, cross_region_ranking_loss, regional_start_loss
from .window_selector import WindowSelector, window_selector_loss


class LongBirdLMHead(nn.Module):
    """dense -> act -> LayerNorm -> decoder: the common shape of BERT's, RoBERTa's and ELECTRA's MLM heads."""

    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.act = ACT2FN[config.lm_head_act or config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states):
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden_states)))) + self.bias


class LongBirdForMaskedLM(LongBirdPreTrainedModel):
    _tied_weights_keys: ClassVar[dict[str, str]] = {
        "lm_head.decoder.weight": "longbird.embeddings.word_embeddings.weight"}

    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.longbird = LongBirdModel(config)
        self.lm_head = LongBirdLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def resize_token_embeddings(self, *args, **kwargs):
        """transformers' resize (the tied table and decoder), and the head's own bias with them: it lives beside the
        decoder (`LongBirdLMHead`), where transformers' resize does not look. New tokens' biases start at 0."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        old, rows = self.lm_head.bias, embeddings.weight.shape[0]
        if old.shape[0] != rows:
            bias = old.new_zeros(rows)
            kept = min(rows, old.shape[0])
            bias[:kept] = old.detach()[:kept]
            self.lm_head.bias = nn.Parameter(bias, requires_grad=old.requires_grad)
        return embeddings

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_hidden_states=None, **kwargs):
        refuse_attention_maps(self.config, kwargs.get("output_attentions"))
        outputs = self.longbird(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class LongBirdForSequenceClassification(LongBirdPreTrainedModel):
    """Classifier on the pooled [CLS] state (the source pooler when it has one, else the raw [CLS] state)."""

    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.longbird = LongBirdModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_hidden_states=None, **kwargs):
        refuse_attention_maps(self.config, kwargs.get("output_attentions"))
        outputs = self.longbird(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                output_hidden_states=output_hidden_states, return_dict=True)
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state[:, 0]
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            loss = classification_loss(logits, labels, self.config.problem_type)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, problem_type: str | None) -> torch.Tensor:
    """transformers' convention for sequence classification: `config.problem_type` "regression" (MSE),
    "single_label_classification" (cross-entropy over integer labels) or "multi_label_classification" (binary
    cross-entropy per label, multi-hot labels of any dtype); unset, one label is regression, integer labels single-label
    and float labels multi-label. In fp32 whatever the logits' dtype."""
    if problem_type is None:
        problem_type = ("regression" if logits.shape[-1] == 1 else "multi_label_classification"
                        if labels.dtype.is_floating_point else "single_label_classification")
    if problem_type == "regression":
        return nn.functional.mse_loss(logits.float().squeeze(-1) if logits.shape[-1] == 1 else logits.float(),
                                      labels.float().view(-1) if logits.shape[-1] == 1 else labels.float())
    if problem_type == "multi_label_classification":
        return nn.functional.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


@dataclass
class LongBirdQuestionAnsweringOutput(QuestionAnsweringModelOutput):
    """`end_logits` are conditioned on the gold start when `start_positions` is given, else on the best start.
    For decoding, `start_top_index` (B, k) holds the k best starts and `end_top_logits` (B, k, l) the end
    logits conditioned on each of them."""

    start_top_index: torch.LongTensor | None = None
    end_top_logits: torch.FloatTensor | None = None
    # (B,) fp32 with `config.qa_selector_weight`: the window selector's correction c_w to each row's null-relative
    # scores (window_selector.py); None without a selector
    selector_logits: torch.FloatTensor | None = None


class ConditionalEndHead(nn.Module):
    """end_logit(j | s) = w . LN(GELU(W [h_s; h_j] + b)) (LittleBird A.2, after XLNet's end head).

    W [h_s; h_j] = W_s h_s + W_j h_j, so W_j H is computed once and each start only adds a vector.
    """

    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.activation = ACT2FN["gelu"]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.out = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor, start_index: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """hidden_states (B, l, h), start_index (B, k) -> end logits (B, k, l).

        `width`: only the ends j with 0 <= j - s < width are computed for a start s (decoding reads no others: its
        spans are at most `max_answer_tokens` long), the rest hold the dtype's lowest value. Why: the (B, k, l, h)
        GELU and LayerNorm over every end are most of the head's time on a long window (k = 20 starts by 4,096 ends
        by 384 is 31 M values, about 20 ms of a 0.4-second 4K-token answer); the band is k by `width` by h. Where an
        end is computed it is the same arithmetic as without `width` (the same product over all l rows, then
        gathered)."""
        size = hidden_states.shape[-1]
        weight_start, weight_end = self.dense.weight[:, :size], self.dense.weight[:, size:]
        starts = hidden_states.gather(1, start_index[..., None].expand(-1, -1, size))  # (B, k, h)
        from_start = starts @ weight_start.T + self.dense.bias  # (B, k, h)
        from_end = hidden_states @ weight_end.T  # (B, l, h)
        length = hidden_states.shape[1]
        if width is None or width >= length:
            mixed = self.LayerNorm(self.activation(from_start[:, :, None] + from_end[:, None]))  # (B, k, l, h)
            return self.out(mixed).squeeze(-1)
        batch, k = start_index.shape
        # past the window's last token the band repeats it: the same value written twice, never a wrong one
        ends = (start_index[..., None] + torch.arange(width, device=start_index.device)).clamp(max=length - 1)
        from_band = from_end.gather(1, ends.reshape(batch, k * width, 1).expand(-1, -1, from_end.shape[-1]))
        mixed = self.LayerNorm(self.activation(from_start[:, :, None] + from_band.view(batch, k, width, -1)))
        band = self.out(mixed).squeeze(-1)  # (B, k, width)
        return band.new_full((batch, k, length), torch.finfo(band.dtype).min).scatter(2, ends, band)


def _mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the rows with a target; 0 (with a gradient path) when every row is ignored."""
    total = nn.functional.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)


def _masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)


class LongBirdForQuestionAnswering(LongBirdPreTrainedModel):
    """Extractive QA. `config.qa_head`: "conditional" (start, then end given the start; default) or
    "linear" (independent start/end, BERT-style). Answers outside the input point at index 0 ([CLS])."""

    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.longbird = LongBirdModel(config)
        if config.qa_head == "linear":
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        else:
            self.qa_start = nn.Linear(config.hidden_size, 1)
            self.qa_end = ConditionalEndHead(config)
        if config.qa_selector_weight:
            self.qa_selector = WindowSelector(config.hidden_size)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, output_hidden_states=None,
                return_dict=None, top_k: int | None = None, start_candidates=None, region_nulls=None,
                document_ids=None, end_width: int | None = None, **kwargs):
        """`start_candidates` (B, l) bool, optional: where the k best starts may be picked (e.g. the document
        tokens when decoding); the returned `start_logits` are not restricted by it. `region_nulls` (B, l) long,
        optional: each token's regional null (data/null_regions.py); with labels the start loss is then taken per
        region (`regional_start_loss`). Decoding reads it from the features, not from here. `document_ids` (B,)
        long, optional: with `config.linked_windows`, the rows of one document are linked (linked_windows.py) and
        with labels and `qa_ranking_weight` the start loss ranks across them (`cross_window_ranking_loss`); with
        `qa_selector_weight` the window selector's loss over them is added (window_selector.py). `end_width`: the
        conditional head computes the k best starts' ends only up to `end_width` tokens from each start
        (`ConditionalEndHead`; decoding with `max_answer_tokens` passes it), the others masked; the teacher-forced
        ends of training are always computed over the whole input."""
        refuse_attention_maps(self.config, kwargs.get("output_attentions"))
        outputs = self.longbird(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                output_hidden_states=output_hidden_states, document_ids=document_ids,
                                return_dict=True)
        hidden = outputs.last_hidden_state
        batch, length = hidden.shape[:2]
        valid = (attention_mask.bool() if attention_mask is not None
                 else torch.ones(batch, length, dtype=torch.bool, device=hidden.device))
        top_k = min(top_k or self.config.qa_top_k, length)
        candidates = valid if start_candidates is None else valid & start_candidates.bool()
        labelled = start_positions is not None and end_positions is not None
        if labelled:
            # A label outside the input, on padding or with its end before its start is ignored (never clamped onto
            # a real token): the row adds no loss. The conditional head cannot place such an end at all (every
            # allowed logit is masked: a loss of ~3e38), and no reading of a span can return one.
            in_range = ((start_positions >= 0) & (start_positions < length) & (end_positions >= 0)
                        & (end_positions < length))
            on_tokens = lambda index: valid.gather(1, index.clamp(0, length - 1)[:, None]).squeeze(1)
            in_range = in_range & on_tokens(start_positions) & on_tokens(end_positions) & (
                end_positions >= start_positions)
            start_targets = start_positions.masked_fill(~in_range, IGNORE_INDEX)
            end_targets = end_positions.masked_fill(~in_range, IGNORE_INDEX)
            start_positions = start_positions.masked_fill(~in_range, 0)  # only feeds the teacher-forced head
        if self.config.qa_head == "linear":
            start_logits, end_logits = self.qa_outputs(hidden).unbind(dim=-1)
            start_logits, end_logits = _masked(start_logits, valid), _masked(end_logits, valid)
            start_top_index = _masked(start_logits, candidates).topk(top_k, dim=-1).indices
            end_top_logits = end_logits[:, None].expand(-1, top_k, -1)
        else:
            start_logits = _masked(self.qa_start(hidden).squeeze(-1), valid)
            start_top_index = _masked(start_logits, candidates).topk(top_k, dim=-1).indices
            positions = torch.arange(length, device=hidden.device)
            end_top_logits = None
            if not (labelled and self.training):  # decoding needs ends for the k best starts
                allowed = valid[:, None] & (positions >= start_top_index[..., None])  # an end never precedes its start
                end_top_logits = _masked(self.qa_end(hidden, start_top_index, end_width), allowed)
            if labelled:  # teacher forcing: the end is predicted from the gold start
                allowed = valid & (positions >= start_positions[:, None])
                end_logits = _masked(self.qa_end(hidden, start_positions[:, None])[:, 0], allowed)
            else:
                end_logits = end_top_logits[:, 0]
        selector_logits = self.qa_selector(hidden) if hasattr(self, "qa_selector") else None
        loss = None
        if labelled:
            start_loss = (_mean_cross_entropy(start_logits, start_targets) if region_nulls is None
                          else regional_start_loss(start_logits, region_nulls, valid, start_targets,
                                                   NullRegions.max_regions(self.config, length)))
            weight, ranking = self.config.qa_ranking_weight, None
            if weight and region_nulls is not None:  # across the regions of a window
                ranking = cross_region_ranking_loss(start_logits, region_nulls, valid, start_targets)
            elif weight and document_ids is not None and self.config.linked_windows:  # across a document's windows
                ranking = cross_window_ranking_loss(start_logits, valid, start_targets, document_ids, IGNORE_INDEX)
            if ranking is not None:
                start_loss = (1 - weight) * start_loss + weight * ranking
            loss = (start_loss + _mean_cross_entropy(end_logits, end_targets)) / 2
            if selector_logits is not None and document_ids is not None:
                loss = loss + self.config.qa_selector_weight * window_selector_loss(
                    selector_logits, start_logits, valid, start_targets, document_ids, IGNORE_INDEX)
        output = LongBirdQuestionAnsweringOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=outputs.hidden_states,
            start_top_index=start_top_index, end_top_logits=end_top_logits, selector_logits=selector_logits,
        )
        return output.to_tuple() if return_dict is False else output  # positional; by keyword: @can_return_tuple


@dataclass
class SpanSelectionOutput(ModelOutput):
    """Per `[QUESTION]` token (B, Q): `start_logits`/`end_logits` (B, Q, l), the end conditioned on the gold start in
    training and on the best start otherwise; `predicted_start`/`predicted_end` (B, Q)."""

    loss: torch.FloatTensor | None = None
    start_logits: torch.FloatTensor | None = None
    end_logits: torch.FloatTensor | None = None
    predicted_start: torch.LongTensor | None = None
    predicted_end: torch.LongTensor | None = None


class LongBirdForSpanSelection(LongBirdPreTrainedModel):
    """Recurring Span Selection head (Ram et al. 2021; LittleBird §4.1, its heads A.1): from each `[QUESTION]` token
    q, start logits (W_s h_q)·h_i, then end logits (W_e [h_q; h_start])·h_i given the start
    (start-then-conditional-end)."""

    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.longbird = LongBirdModel(config)
        self.start_query = nn.Linear(config.hidden_size, config.hidden_size)
        self.end_query = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, question_positions=None, start_positions=None, end_positions=None,
                output_hidden_states=None, **kwargs):
        refuse_attention_maps(self.config, kwargs.get("output_attentions"))
        if question_positions is None:
            raise ValueError("LongBirdForSpanSelection needs question_positions (B, Q): where the [QUESTION] "
                             "tokens are")
        hidden = self.longbird(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                               output_hidden_states=output_hidden_states, return_dict=True).last_hidden_state
        size = hidden.shape[-1]
        gather = lambda index: hidden.gather(1, index.clamp(min=0)[..., None].expand(-1, -1, size))
        questions = gather(question_positions)  # (B, Q, h)
        mask = (attention_mask.bool() if attention_mask is not None
                else torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device))
        start_logits = _masked(self.start_query(questions) @ hidden.transpose(1, 2), mask[:, None])
        predicted_start = start_logits.argmax(-1)
        given = start_positions if start_positions is not None else predicted_start
        end_query = self.end_query(torch.cat([questions, gather(given)], dim=-1))
        positions = torch.arange(hidden.shape[1], device=hidden.device)
        after = positions[None, None, :] >= given.clamp(min=0)[..., None]  # the end is not before the start
        end_logits = _masked(end_query @ hidden.transpose(1, 2), mask[:, None] & after)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = (_mean_cross_entropy(start_logits.flatten(0, 1), start_positions.flatten())
                    + _mean_cross_entropy(end_logits.flatten(0, 1), end_positions.flatten())) / 2
        return SpanSelectionOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                   predicted_start=predicted_start, predicted_end=end_logits.argmax(-1))
