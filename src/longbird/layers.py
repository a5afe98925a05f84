"""The modules of one encoder layer: embeddings, self-attention, the feed-forward block, and the BigBird/full
(`LongBirdLayer`) and LittleBird (`LittleBirdLayer`) layers built from them. Module names mirror transformers' BERT
so weights map one to one. Each layer reaches its attention kernel through `dispatch` (one call per layer).
Shapes: B batch, H heads, l length, d head size, s pack size (as in `longbird.attention`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from . import dispatch
from .attention import pack_attention, reference_attention
from .attention.tracing import is_tracing
from .config import LongBirdConfig
from .positions import tape as tape_states
from .positions.alibi import BiALiBi


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
        if isinstance(plan, dispatch.PlanInGraph):  # torch.compile: the per-row plan inside one op
            return dispatch.bigbird_rows(query, key, value, key_mask, plan, self.attention_dropout())
        groups, patterns = plan if plan is not None else (None, None)
        return dispatch.bigbird(query, key, value, key_mask, groups, patterns, backend, workspace,
                                self.attention_dropout(), reference=use_reference)


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
                                                        config.tape_channels, ACT2FN[config.hidden_act])
            self.tape_phase = _tape_phase(config)

    def forward(self, hidden_states, key_mask, plan=None, use_reference=False, workspace=None, backend=None,
                tape=None):
        """Returns the hidden states, or (hidden states, TAPE states) when `tape` states are given."""
        if tape is None:
            return feed_forward(self, self.attention(hidden_states, key_mask, plan, use_reference, workspace, backend))
        if self.tape_phase is not None:  # TAPE: the content turns each state's phase (TapePhase)
            tape = self.tape_phase(tape, hidden_states)
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
                                                        config.tape_channels, ACT2FN[config.hidden_act])
            self.tape_phase = _tape_phase(config)

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
            if self.tape_phase is not None:  # TAPE: the content turns each state's phase (TapePhase)
                tape = self.tape_phase(tape, hidden_states)
            query, key, value, pack_key, pack_value = _tape_usw_inputs(query, key, value, pack_key, pack_value, tape)
            scale = unpack.head_dim ** -0.5  # the head's own scale, not that of the widened q, k
        context = dispatch.usw(query, key, value, key_mask, positions, self.bialibi, self.block_size, pack_key,
                               pack_value, backend, layout, workspace, unpack.attention_dropout(), scale,
                               reference=use_reference)
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


def _tape_phase(config) -> tape_states.TapePhase | None:
    """The layer's TAPE phase rotation, or None for the real-only ("gain-only") states of config.tape_phase=False."""
    if not config.tape_phase:
        return None
    heads = config.num_attention_heads
    return tape_states.TapePhase(config.hidden_size, heads, config.hidden_size // heads // 2)


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
