"""LongBirdModel: embeddings, the encoder's layers (layers.py) and the pooler; task heads live in heads.py.

Per row the encoder chooses its attention (attention/rows.py): full (SDPA) when the row's real length is at or
below `config.full_attention_threshold`, otherwise the configured sparse kernel over the row's own blocks, on inputs
right-padded to a block multiple (padding masked as keys and stripped from outputs). The kernel (compiled flex or
blocked) is chosen once per forward (`dispatch.choose_backend`). `attn_implementation="reference"` routes every
layer through the dense oracle with the same pattern materialised as a mask.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.modeling_utils import AttentionInterface
from transformers.utils.generic import can_return_tuple

from .attention import bigbird_pattern, usw_layout
from .attention.rows import RowGroup, padded_length, plan_batch, plan_rows
from .attention.tracing import check_dynamic_length, graph_cannot_branch_on_data
from .config import LongBirdConfig, validated
from .dispatch import PlanInGraph, SparseBackend, choose_backend
from .layers import LittleBirdLayer, LongBirdEmbeddings, LongBirdLayer, LongBirdSelfAttention
from .linked_windows import WindowLinks
from .positions import tape as tape_states
from .positions.alibi import BiALiBi, alibi_slopes
from .window_selector import WindowSelector

REFERENCE = "reference"


def _reference_marker(*args, **kwargs):
    raise RuntimeError("longbird's 'reference' implementation is dispatched inside LongBirdModel, not called directly")


# Registering the name lets `from_pretrained(..., attn_implementation="reference")` pass transformers' checks.
AttentionInterface.register(REFERENCE, _reference_marker)


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Recompute every layer in backward: `activation_checkpointing_enable()` where transformers has it (5.2x; the
    old name `gradient_checkpointing_enable` warns there), else the old name (transformers 5.17 on the GPU machine)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


def _compute_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    """The dtype attention computes in: autocast's when autocast is on for the device, else the states' own."""
    device = hidden_states.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_states.dtype


class LongBirdEncoder(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.config = config
        layer_class = LittleBirdLayer if config.attention == "littlebird" else LongBirdLayer
        self.layer = nn.ModuleList(layer_class(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False  # set by PreTrainedModel.gradient_checkpointing_enable()
        if config.attention == "littlebird" and config.pack_size > 0:
            # P: s learned pack vectors at the input, carried from layer to layer (LittleBird §3.3).
            self.pack_embeddings = nn.Parameter(torch.randn(config.pack_size, config.hidden_size)
                                                * config.initializer_range)
        if config.linked_windows:  # the [CLS] states of one document's windows read each other (linked_windows.py)
            self.links = WindowLinks(config.num_hidden_layers)

    def uses_sparse_attention(self, length: int) -> bool:
        """Whether a row of `length` real tokens takes the sparse pattern: decided per row, never per batch, and the
        model is never switched permanently."""
        return self.config.attention == "bigbird" and length > self.config.full_attention_threshold

    def _backend(self, hidden_states) -> SparseBackend:
        config = self.config
        return choose_backend(config.attention_backend, hidden_states.device, hidden_states.shape[1],
                              config.block_size,
                              attention_dropout=self.training and config.attention_probs_dropout_prob > 0,
                              repeated_blocks=config.attention == "bigbird" and config.random_blocks == "transformers",
                              position_states=config.position == "tape", dtype=_compute_dtype(hidden_states),
                              kernel=config.sparse_kernel,
                              head_size=config.hidden_size // config.num_attention_heads)

    def _initial_tape_states(self, position_ids):
        """TAPE's (B, H, l, d/2, 2) states from the (padded) position ids, or None without TAPE."""
        config = self.config
        if config.position != "tape":
            return None
        return tape_states.initial_states(position_ids, config.num_attention_heads,
                                          config.hidden_size // config.num_attention_heads, config.tape_init,
                                          config.tape_rope_base)

    def _call_layer(self, layer, *args, backend=None):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # Recompute the layer in backward: activation memory of one layer instead of all of them.
            if backend is not None and backend.name == "flex":
                # Compiled flex under non-reentrant checkpointing runs inside saved-tensor hooks, which torch.compile
                # does not trace (measured on CUDA: it fell back to eager flex); the reentrant variant has no hooks.
                return torch.utils.checkpoint.checkpoint(layer.__call__, *args, use_reentrant=True)
            checkpoint = getattr(self, "_gradient_checkpointing_func", None) or functools.partial(
                torch.utils.checkpoint.checkpoint, use_reentrant=False)
            return checkpoint(layer.__call__, *args)
        return layer(*args)

    def forward(self, hidden_states, key_mask, position_ids, use_reference=False, output_hidden_states=False,
                document_ids=None):
        """`document_ids` (B,) long: with `config.linked_windows`, rows of one document are linked
        (linked_windows.py); None links no row."""
        config = self.config
        length = hidden_states.shape[1]
        check_dynamic_length(length, config.block_size, config.attention, config.full_attention_threshold)
        if config.attention == "littlebird":
            return self._forward_littlebird(hidden_states, key_mask, position_ids, use_reference, output_hidden_states)
        # Per row: full or sparse, its block count, its last global block and its random plan (attention/rows.py).
        in_graph = False  # compile/export: each layer makes the per-row plan in the graph (dispatch.bigbird_rows)
        if config.attention != "bigbird":
            groups = [RowGroup(None, length, 0)]
        elif torch.jit.is_tracing() or (use_reference and graph_cannot_branch_on_data()):
            # the legacy ONNX exporter (and the dense oracle under export) cannot read row lengths: one decision
            groups = plan_batch(length, config.block_size, config.full_attention_threshold)
        elif (torch.compiler.is_compiling() or graph_cannot_branch_on_data()) and not use_reference:
            # torch.compile and torch.export cannot read the rows' lengths either, but the graph can make each row's
            # plan (on the device, or in an op that reads them): from the input length alone, pad to the block
            # multiple the longest sparse row would need (padding is masked and stripped).
            groups = plan_batch(length, config.block_size, config.full_attention_threshold)
            in_graph = groups[0].sparse
        else:
            groups = plan_rows(key_mask, config.block_size, config.full_attention_threshold)
        sparse = any(group.sparse for group in groups)
        padded = padded_length(groups, length)
        if padded != length:  # right-pad to the longest row's block multiple; padded keys are masked, rows stripped
            hidden_states = nn.functional.pad(hidden_states, (0, 0, 0, padded - length))
            key_mask = nn.functional.pad(key_mask, (0, padded - length), value=False)
        all_hidden = [hidden_states[:, :length]] if output_hidden_states else None
        workspace = {}  # per-call scratch buffers shared by the layers (inference only)
        backend = self._backend(hidden_states) if sparse and not use_reference else None
        positions = nn.functional.pad(position_ids, (0, padded - length)) if padded != length else position_ids
        tape = self._initial_tape_states(positions)
        pattern_arguments = config.pattern_arguments  # once per call, not per layer
        for index, layer in enumerate(self.layer):
            plan = None
            if in_graph:
                plan = PlanInGraph(index, config.block_size, config.full_attention_threshold, config.num_random_blocks,
                                   config.random_seed, config.random_blocks, *pattern_arguments,
                                   config.max_position_embeddings)
            elif sparse:
                # Drawn outside any trace from (seed, layer, n): an exported graph holds it as a constant.
                plan = (groups, [bigbird_pattern(int(group.num_blocks), config.block_size,
                                                 config.num_attention_heads, config.num_random_blocks,
                                                 config.random_seed, index, config.random_blocks, *pattern_arguments)
                                 if group.sparse else None for group in groups])
            if tape is None:
                hidden_states = self._call_layer(layer, hidden_states, key_mask, plan, use_reference, workspace,
                                                 backend, backend=backend)
            else:
                hidden_states, tape = self._call_layer(layer, hidden_states, key_mask, plan, use_reference,
                                                       workspace, backend, tape, backend=backend)
            if document_ids is not None and hasattr(self, "links"):
                hidden_states = self.links(index, layer, hidden_states, document_ids)
            if output_hidden_states:
                all_hidden.append(hidden_states[:, :length])
        return hidden_states[:, :length], all_hidden

    def _forward_littlebird(self, hidden_states, key_mask, position_ids, use_reference, output_hidden_states):
        batch, length, _ = hidden_states.shape
        padded = -(-length // self.config.block_size) * self.config.block_size
        if padded != length:  # right-pad to a block multiple; padded keys are masked, rows stripped below
            hidden_states = nn.functional.pad(hidden_states, (0, 0, 0, padded - length))
            key_mask = nn.functional.pad(key_mask, (0, padded - length), value=False)
            position_ids = nn.functional.pad(position_ids, (0, padded - length))
        pack = getattr(self, "pack_embeddings", None)
        pack = pack.to(hidden_states.dtype)[None].expand(batch, -1, -1) if pack is not None else None
        all_hidden = [hidden_states[:, :length]] if output_hidden_states else None
        backend = None if use_reference else self._backend(hidden_states)
        # Blocking, padding and BiALiBi distances are the same in every layer: computed once per call.
        layout = usw_layout(key_mask, position_ids, self.config.block_size, self.layer[0].bialibi) \
            if backend is not None and backend.name == "blocked" else None
        workspace = {}  # per-call scratch buffers shared by the layers (inference only)
        tape = self._initial_tape_states(position_ids)
        for layer in self.layer:
            if tape is None:
                hidden_states, pack = self._call_layer(layer, hidden_states, key_mask, position_ids, pack, layout,
                                                       workspace, backend, use_reference, backend=backend)
            else:
                hidden_states, pack, tape = self._call_layer(layer, hidden_states, key_mask, position_ids, pack,
                                                             layout, workspace, backend, use_reference, tape,
                                                             backend=backend)
            if output_hidden_states:
                all_hidden.append(hidden_states[:, :length])
        return hidden_states[:, :length], all_hidden


class LongBirdPreTrainedModel(PreTrainedModel):
    config_class = LongBirdConfig
    config: LongBirdConfig
    base_model_prefix = "longbird"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    # Heads return a mean loss; Trainer must still divide it for gradient accumulation.
    accepts_loss_kwargs = False

    def __init__(self, config: LongBirdConfig, *args, **kwargs):
        super().__init__(validated(config), *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BiALiBi):
            slopes = alibi_slopes(module.alpha.shape[0])
            for parameter in (module.alpha, module.beta, module.gamma):
                parameter.copy_(slopes)
        elif isinstance(module, LongBirdEncoder) and hasattr(module, "pack_embeddings"):
            module.pack_embeddings.normal_(0.0, self.config.initializer_range)
        elif isinstance(module, tape_states.TapeFeedForward):  # W1 zero: the states are unchanged at init (TAPE)
            module.tape_ffn_in.zero_()
            module.tape_ffn_out.normal_(0.0, module.tape_ffn_out.shape[1] ** -0.5)
        elif isinstance(module, tape_states.TapePhase):  # gate zero: no rotation at init (the clock is an nn.Linear)
            module.tape_phase_gate.zero_()
        elif isinstance(module, LongBirdSelfAttention) and hasattr(module, "tape_post"):
            module.tape_post.zero_()
        elif isinstance(module, WindowLinks):  # gates zero: linked windows read as unlinked at init
            module.gates.zero_()
        elif isinstance(module, WindowSelector):  # zero: a reader with a selector reads as without one at init
            module.weight.zero_()
            module.bias.zero_()


class LongBirdModel(LongBirdPreTrainedModel):
    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.embeddings = LongBirdEmbeddings(config)
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)  # ELECTRA
        self.encoder = LongBirdEncoder(config)
        self.pooler = LongBirdPooler(config) if config.add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _check_inputs(self, input_ids, inputs_embeds, token_type_ids, position_ids):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        shape = input_ids.shape if input_ids is not None else inputs_embeds.shape[:2]
        length, limit = shape[1], self.config.max_position_embeddings
        if length > limit:
            raise ValueError(
                f"input length {length} exceeds max_position_embeddings ({limit}); truncate or window the input "
                f"to {limit} tokens, or convert with max_length >= {length}"
            )
        if token_type_ids is not None and token_type_ids.numel() and (
            token_type_ids.min() < 0 or token_type_ids.max() >= self.config.type_vocab_size
        ):
            too_large = token_type_ids.max() >= self.config.type_vocab_size
            bad = int(token_type_ids.max() if too_large else token_type_ids.min())
            raise ValueError(
                f"token_type_ids contains {bad}, outside 0..{self.config.type_vocab_size - 1} "
                f"(type_vocab_size={self.config.type_vocab_size}); convert with type_vocab_size={bad + 1} "
                "or fix the ids"
            )
        if position_ids is not None and position_ids.numel():
            if position_ids.min() < 0:
                raise ValueError(f"position_ids must be >= 0; got {int(position_ids.min())}")
            # A learned table (absolute, TAPE over a converted source) has `limit` rows; relative methods (BiALiBi,
            # TAPE's RoPE states) accept any gap (Padding Insertion).
            if self.config.uses_position_table and position_ids.max() >= limit:
                raise ValueError(f"position_ids must lie in 0..{limit - 1} for a learned position table; "
                                 f"got max {int(position_ids.max())}")
        return shape

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,  # @can_return_tuple: False (or config.return_dict False) returns a tuple
        document_ids=None,
        output_attentions=None,
        **kwargs,
    ):
        refuse_attention_maps(self.config, output_attentions)
        batch, length = self._check_inputs(input_ids, inputs_embeds, token_type_ids, position_ids)
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        if attention_mask is None:
            attention_mask = torch.ones(batch, length, dtype=torch.bool, device=device)
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=device)
        if position_ids is None:
            position_ids = torch.arange(length, device=device).expand(batch, -1)
        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        if hasattr(self, "embeddings_project"):
            hidden_states = self.embeddings_project(hidden_states)
        use_reference = self.config._attn_implementation == REFERENCE
        output_hidden_states = bool(output_hidden_states or self.config.output_hidden_states)
        sequence_output, all_hidden = self.encoder(
            hidden_states, attention_mask.bool(), position_ids, use_reference, output_hidden_states, document_ids
        )
        pooled = self.pooler(sequence_output) if self.pooler is not None else None
        output = BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=pooled,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
        )
        # @can_return_tuple reads return_dict given by keyword; a positional False is honoured here
        return output.to_tuple() if return_dict is False else output


def refuse_attention_maps(config, output_attentions=None) -> None:
    """`output_attentions` (the call's or the config's) was dropped silently (attentions=None): refused by name."""
    if output_attentions or getattr(config, "output_attentions", False):
        raise ValueError("longbird returns no attention maps: its block-sparse and sliding-window kernels never form "
                         "the length × length matrix; leave output_attentions off")


class LongBirdPooler(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))
