"""LongBirdModel (embeddings, layers, encoder); task heads live in heads.py. Module names mirror transformers' BERT so weights map one to one.

Per row the encoder chooses its attention (attention/rows.py): full (SDPA) when the row's real length is at or
below `config.full_attention_threshold`, otherwise the configured sparse kernel over the row's own blocks, on inputs
right-padded to a block multiple (padding masked as keys and stripped from outputs). `attn_implementation="reference"` routes
every layer through the dense oracle with the same pattern materialised as a mask.
"""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.modeling_utils import AttentionInterface

from .attention import (bigbird_attention, bigbird_pattern, full_attention, pack_attention, reference_attention,
                        usw_attention, usw_attention_reference, usw_layout)
from .attention.backend import SparseBackend, choose_backend
from .attention.flex import bigbird_flex_attention, usw_flex_attention
from .attention.rows import RowGroup, padded_length, plan_batch, plan_rows, run_groups
from .config import LongBirdConfig
from .positions import tape as tape_states
from .positions.alibi import BiALiBi, alibi_slopes
from .tracing import check_dynamic_length, graph_cannot_branch_on_data, is_tracing

REFERENCE = "reference"


def _reference_marker(*args, **kwargs):
    raise RuntimeError("longbird's 'reference' implementation is dispatched inside LongBirdModel, not called directly")


# Registering the name lets `from_pretrained(..., attn_implementation="reference")` pass transformers' checks.
AttentionInterface.register(REFERENCE, _reference_marker)


class LongBirdEmbeddings(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        width = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        # Relative methods (BiALiBi) carry positions in attention: no absolute table.
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, width) if config.uses_position_table else None
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        if self.position_embeddings is not None:
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class LongBirdSelfAttention(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = float(config.attention_probs_dropout_prob)
        if config.position == "tape":  # W_post: heads -> heads, zero at init (TAPE, attention side)
            self.tape_post = nn.Parameter(torch.zeros(self.num_heads, self.num_heads))

    def attention_dropout(self) -> float:
        """The attention dropout of this call: the config's probability in training, 0 in eval."""
        return self.dropout_p if self.training else 0.0

    def _heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (b, h, n, d)

    @staticmethod
    def _merge(context):
        batch, _, length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, length, -1)

    def forward(self, hidden_states, key_mask, plan=None, use_reference=False, workspace=None, backend=None,
                tape=None):
        """`plan`: None (full attention for every row) or the call's row groups with this layer's patterns.
        `tape`: TAPE position states (B, H, l, d/2, 2) or None; with them, returns (context, updated states)."""
        query, key, value = (self._heads(proj(hidden_states)) for proj in (self.query, self.key, self.value))
        if tape is not None:  # TAPE: q ⊙ e_i, k ⊙ e_j, and the states ride beside V through the kernel
            query, key = tape_states.rotate(query, tape), tape_states.rotate(key, tape)
            value = tape_states.with_states(value, tape)
        context = self._attend(query, key, value, key_mask, plan, use_reference, workspace, backend)
        if tape is None:
            return self._merge(context)
        context, attended = tape_states.split_states(context, self.head_dim)
        # e_i ← e_i + Σ_h' W_post[h, h'] Σ_j a^{h'}_ij e_j^{h'} (TAPE, attention side)
        return self._merge(context), tape + tape_states.mix_heads(self.tape_post, attended.to(tape.dtype))

    def _attend(self, query, key, value, key_mask, plan, use_reference, workspace, backend):
        if plan is None:
            attend = self._attend_reference if use_reference else self._attend_full
            return attend(query, key, value, key_mask, None)

        def attend(q, k, v, mask, pattern):
            if use_reference:
                return self._attend_reference(q, k, v, mask, pattern)
            if pattern is None:
                return self._attend_full(q, k, v, mask, None)
            return (backend or SparseBackend()).run(
                lambda: bigbird_flex_attention(q, k, v, mask, pattern, workspace=workspace),
                lambda: bigbird_attention(q, k, v, mask, pattern, workspace, self.attention_dropout()),
                q, "bigbird")

        groups, patterns = plan
        return run_groups(groups, patterns, query, key, value, key_mask, attend)

    def _attend_full(self, query, key, value, key_mask, pattern):
        return full_attention(query, key, value, key_mask, self.attention_dropout())

    def _attend_reference(self, query, key, value, key_mask, pattern):
        mask, bias = key_mask[:, None, None, :], None
        if pattern is not None:
            counts = pattern.materialize_counts().to(key_mask.device)[None]
            mask = mask & (counts > 0)
            # A key block counted k times (the transformers plan) weighs k·exp(s) in the softmax: bias log k.
            bias = counts.clamp(min=1).float().log() if pattern.repeats_blocks else None
        return reference_attention(query, key, value, mask, bias, dropout_p=self.attention_dropout(),
                                   record_pack_keys=0)


class LongBirdSelfOutput(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class LongBirdAttention(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.self = LongBirdSelfAttention(config)
        self.output = LongBirdSelfOutput(config)

    def forward(self, hidden_states, key_mask, plan=None, use_reference=False, workspace=None, backend=None,
                tape=None):
        if tape is None:
            return self.output(self.self(hidden_states, key_mask, plan, use_reference, workspace, backend),
                               hidden_states)
        context, tape = self.self(hidden_states, key_mask, plan, use_reference, workspace, backend, tape)
        return self.output(context, hidden_states), tape


class LongBirdIntermediate(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class LongBirdOutput(LongBirdSelfOutput):
    def __init__(self, config: LongBirdConfig):
        super().__init__(config)
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Recompute every layer in backward: `activation_checkpointing_enable()` where transformers has it (5.2x; the
    old name `gradient_checkpointing_enable` warns there), else the old name (transformers 5.17 on the GPU machine)."""
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()


class _ActivationSavedAsInput:
    """Saved-tensor hooks for X = LN(W2 act(W1 A) + A): W2's backward needs act(W1 A) (l x 4h per layer, the largest
    activation autograd keeps), but the activation's own backward keeps its input W1 A anyway, so act(W1 A) is saved
    as a reference to that input and recomputed when backward unpacks it (one elementwise pass; no matmul redone)."""

    def __init__(self, activation, pre_activation: torch.Tensor):
        # The output's storage address only: holding the output itself here would keep it alive through backward.
        self.activation, self.pre_activation, self.output_storage = activation, pre_activation, None
        device = pre_activation.device.type
        self.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))

    def __call__(self) -> torch.Tensor:
        output = self.activation(self.pre_activation)
        self.output_storage = output.untyped_storage().data_ptr()
        return output

    def pack(self, tensor: torch.Tensor):
        if self.output_storage is not None and tensor.untyped_storage().data_ptr() == self.output_storage:
            return ("recompute", tensor.shape, tensor.stride(), tensor.storage_offset(), tensor.dtype)
        return tensor

    def unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        _, shape, stride, offset, dtype = packed
        device, dtype_autocast, enabled = self.autocast
        with torch.no_grad(), torch.autocast(device, dtype=dtype_autocast, enabled=enabled):
            output = self.activation(self.pre_activation)
        return output.to(dtype).as_strided(shape, stride, offset)


def feed_forward(layer: nn.Module, attended: torch.Tensor) -> torch.Tensor:
    """X = LN(W2 act(W1 A) + A) through the layer's `intermediate` and `output` modules; in training the activation
    output is recomputed in backward instead of kept (`_ActivationSavedAsInput`), except where the whole layer is
    already recomputed (gradient checkpointing) or traced."""
    intermediate, output = layer.intermediate, layer.output
    if not torch.is_grad_enabled() or is_tracing() or (layer.gradient_checkpointing and layer.training):
        return output(intermediate(attended), attended)
    saver = _ActivationSavedAsInput(intermediate.intermediate_act_fn, intermediate.dense(attended))
    with torch.autograd.graph.saved_tensors_hooks(saver.pack, saver.unpack):
        return output(saver(), attended)


class LongBirdLayer(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.attention = LongBirdAttention(config)
        self.intermediate = LongBirdIntermediate(config)
        self.output = LongBirdOutput(config)
        self.gradient_checkpointing = False  # set with the model's by enable_checkpointing()
        if config.position == "tape":
            self.tape_ffn = tape_states.TapeFeedForward(config.hidden_size, config.num_attention_heads,
                                                        config.tape_channels,
                                            config.hidden_act)

    def forward(self, hidden_states, key_mask, plan=None, use_reference=False, workspace=None, backend=None,
                tape=None):
        """Returns the hidden states, or (hidden states, TAPE states) when `tape` states are given."""
        if tape is None:
            return feed_forward(self, self.attention(hidden_states, key_mask, plan, use_reference, workspace, backend))
        attended, tape = self.attention(hidden_states, key_mask, plan, use_reference, workspace, backend, tape)
        hidden_states = feed_forward(self, attended)
        return hidden_states, self.tape_ffn(tape, hidden_states)  # TAPE, feed-forward side (m_i: the layer output)


class LittleBirdLayer(nn.Module):
    """C_p = Attn(P, X); P = LN(C_p + P); C_x = USWAttn(X, C_p); A = LN(C_x + X); X = LN(FFN(A) + A)
    (LittleBird §3.3). `attention` is the unpack/USW attention; `pack_attention` has its own Q/K/V and the LayerNorm
    of P, and shares unpack attention's output projection unless config.pack_output_projection == "separate"."""

    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.block_size = config.block_size
        self.attention = LongBirdAttention(config)
        self.pack_attention = LongBirdAttention(config) if config.pack_size > 0 else None
        if self.pack_attention is not None and config.pack_output_projection == "shared":
            self.pack_attention.output.dense = None  # C_p = W_O · Attn(P, X), W_O of unpack attention (§3.4)
        self.bialibi = BiALiBi(config.num_attention_heads, learnable=config.bialibi_learnable)
        self.intermediate = LongBirdIntermediate(config)
        self.output = LongBirdOutput(config)
        self.gradient_checkpointing = False  # set with the model's by enable_checkpointing()
        if config.position == "tape":
            if self.pack_attention is not None:  # pack attention reads no position states: no W_post of its own
                del self.pack_attention.self.tape_post
            self.tape_ffn = tape_states.TapeFeedForward(config.hidden_size, config.num_attention_heads,
                                                        config.tape_channels, config.hidden_act)

    def forward(self, hidden_states, key_mask, positions, pack, layout=None, workspace=None, backend=None,
                use_reference=False, tape=None):
        """`backend` picks flex or the blocked kernel (which reads `layout`, from usw_layout, built on demand);
        `use_reference` selects the dense oracle. With TAPE `tape` states, returns (hidden, pack, updated states)."""
        unpack = self.attention.self
        pack_key = pack_value = None
        if self.pack_attention is not None:
            context = self._pack_context(pack, hidden_states, key_mask, use_reference)
            out = self.pack_attention.output
            pack = out.LayerNorm(out.dropout(context) + pack)  # P = LN(C_p + P)
            pack_key, pack_value = unpack._heads(unpack.key(context)), unpack._heads(unpack.value(context))
        query, key, value = (unpack._heads(proj(hidden_states)) for proj in (unpack.query, unpack.key, unpack.value))
        scale = None
        if tape is not None:
            query, key, value, pack_key, pack_value = _tape_usw_inputs(query, key, value, pack_key, pack_value, tape)
            scale = unpack.head_dim ** -0.5  # the head's own scale, not that of the widened q, k
        if use_reference:
            context = usw_attention_reference(query, key, value, key_mask, positions, self.bialibi, self.block_size,
                                              pack_key, pack_value, scale)
        else:
            context = (backend or SparseBackend()).run(
                lambda: usw_flex_attention(query, key, value, key_mask, positions, self.bialibi, self.block_size,
                                           pack_key, pack_value, workspace=workspace),
                lambda: usw_attention(query, key, value, layout or usw_layout(key_mask, positions, self.block_size),
                                      self.bialibi, pack_key, pack_value, workspace, unpack.attention_dropout(),
                                      scale),
                query, "usw")
        if tape is not None:
            context, attended_states = tape_states.split_states(context, unpack.head_dim)
            tape = tape + tape_states.mix_heads(unpack.tape_post, attended_states.to(tape.dtype))
        attended = self.attention.output(unpack._merge(context), hidden_states)  # A = LN(C_x + X)
        hidden_states = feed_forward(self, attended)
        if tape is None:
            return hidden_states, pack
        return hidden_states, pack, self.tape_ffn(tape, hidden_states)  # TAPE, feed-forward side

    def _pack_context(self, pack, hidden_states, key_mask, use_reference):
        """C_p = W_O · Attn(P, X): pack queries over every real token, through the output projection."""
        packer = self.pack_attention.self
        packed = (pack_attention if not use_reference else _dense_pack_attention)(
            packer._heads(packer.query(pack)), packer._heads(packer.key(hidden_states)),
            packer._heads(packer.value(hidden_states)), key_mask, packer.attention_dropout())
        out = self.pack_attention.output
        projection = out.dense if out.dense is not None else self.attention.output.dense
        return projection(packer._merge(packed))


def _tape_usw_inputs(query, key, value, pack_key, pack_value, tape):
    """TAPE in USW attention: token keys see q_i ⊙ e_i · k_j ⊙ e_j and carry their states beside V. Packed keys have
    no position: their logits use the plain query and they carry zero states, so a rotation common to every state
    still cancels (equivariance) and Σ_j a_ij e_j sums token states only. Both are one kernel call on widened
    vectors: q = [q ⊙ e, q], token k = [k ⊙ e, 0], packed k = [0, k_p]; v = [v, e], packed v = [v_p, 0]."""
    rotated_query, rotated_key = tape_states.rotate(query, tape), tape_states.rotate(key, tape)
    value = tape_states.with_states(value, tape)
    if pack_key is None:
        return rotated_query, rotated_key, value, None, None
    query = torch.cat([rotated_query, query], dim=-1)
    key = torch.cat([rotated_key, torch.zeros_like(key)], dim=-1)
    pack_key = torch.cat([torch.zeros_like(pack_key), pack_key], dim=-1)
    pack_value = torch.cat([pack_value, pack_value.new_zeros(pack_value.shape)], dim=-1)
    return query, key, value, pack_key, pack_value


def _dense_pack_attention(pack_query, key, value, key_mask, dropout_p=0.0):
    return reference_attention(pack_query, key, value, key_mask[:, None, None, :], dropout_p=dropout_p)


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

    def uses_sparse_attention(self, length: int) -> bool:
        """Whether a row of `length` real tokens takes the sparse pattern: decided per row, never per batch, and the
        model is never switched permanently."""
        return self.config.attention == "bigbird" and length > self.config.full_attention_threshold

    def _backend(self, hidden_states) -> SparseBackend:
        dropout = self.training and self.config.attention_probs_dropout_prob > 0
        repeated = self.config.attention == "bigbird" and self.config.random_blocks == "transformers"
        if self.config.position == "tape":
            return SparseBackend("blocked", "TAPE: the position states ride beside V, wider than the flex path takes")
        return choose_backend(self.config.attention_backend, hidden_states.device, hidden_states.shape[1],
                              self.config.block_size, attention_dropout=dropout, repeated_blocks=repeated)

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

    def forward(self, hidden_states, key_mask, position_ids, use_reference=False, output_hidden_states=False):
        config = self.config
        length = hidden_states.shape[1]
        check_dynamic_length(length, config.block_size, config.attention, config.full_attention_threshold)
        if config.attention == "littlebird":
            return self._forward_littlebird(hidden_states, key_mask, position_ids, use_reference, output_hidden_states)
        # Per row: full or sparse, its block count, its last global block and its random plan (attention/rows.py).
        if config.attention != "bigbird":
            groups = [RowGroup(None, length, 0)]
        elif graph_cannot_branch_on_data():  # export/jit cannot read row lengths: one decision from the input length
            groups = plan_batch(length, config.block_size, config.full_attention_threshold)
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
        for index, layer in enumerate(self.layer):
            plan = None
            if sparse:
                # Drawn outside any trace from (seed, layer, n): an exported graph holds it as a constant.
                plan = (groups, [bigbird_pattern(int(group.num_blocks), config.block_size,
                                                 config.num_attention_heads, config.num_random_blocks,
                                                 config.random_seed, index, config.random_blocks)
                                 if group.sparse else None for group in groups])
            if tape is None:
                hidden_states = self._call_layer(layer, hidden_states, key_mask, plan, use_reference, workspace,
                                                 backend, backend=backend)
            else:
                hidden_states, tape = self._call_layer(layer, hidden_states, key_mask, plan, use_reference,
                                                       workspace, backend, tape, backend=backend)
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
        layout = usw_layout(key_mask, position_ids, self.config.block_size) \
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
        elif isinstance(module, LongBirdSelfAttention) and hasattr(module, "tape_post"):
            module.tape_post.zero_()


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
            bad = int(token_type_ids.max() if token_type_ids.max() >= self.config.type_vocab_size else token_type_ids.min())
            raise ValueError(
                f"token_type_ids contains {bad}, outside 0..{self.config.type_vocab_size - 1} "
                f"(type_vocab_size={self.config.type_vocab_size}); convert with type_vocab_size={bad + 1} or fix the ids"
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

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
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
            hidden_states, attention_mask.bool(), position_ids, use_reference, output_hidden_states
        )
        pooled = self.pooler(sequence_output) if self.pooler is not None else None
        output = BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=pooled,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
        )
        return output if return_dict is not False else output.to_tuple()


class LongBirdPooler(nn.Module):
    def __init__(self, config: LongBirdConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))
