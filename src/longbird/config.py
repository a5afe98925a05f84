"""LongBirdConfig: the source architecture plus two orthogonal choices, attention and position (design.md §3)."""

from __future__ import annotations

import dataclasses
from typing import Any

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedConfig

from .attention.patterns import GLOBAL_BLOCKS, LOCAL_WINDOWS, RANDOM_BLOCK_PLANS, pattern_arguments
from .positions.tape import TAPE_INITS

ATTENTIONS = ("full", "bigbird", "littlebird")
QA_HEADS = ("conditional", "linear")
ATTENTION_BACKENDS = ("auto", "blocked", "flex")
POSITIONS = ("absolute", "bialibi", "tape")
POSITION_EXTENSIONS = ("taper", "copy")
# Field annotations (strings: postponed evaluation) whose values validate_architecture compares as numbers.
NUMBER_FIELDS = {"int": (int,), "float": (int, float), "float | int": (int, float), "int | None": (int, type(None)),
                 "float | None": (int, float, type(None)), "float | int | None": (int, float, type(None))}
# Methods whose kernels land in later issues; the config names them so errors can say so.
NOT_YET_AVAILABLE = {"attention": set(), "position": set()}

# Paper systems as presets (design.md §3): only the two choices and their knobs, never architecture sizes.
PRESETS: dict[str, dict[str, Any]] = {
    "kobigbird": {"attention": "bigbird", "position": "absolute", "position_extension": "taper",
                  "min_type_vocab_size": 2},
    "full": {"attention": "full", "position": "absolute", "position_extension": "taper"},
    "littlebird": {"attention": "littlebird", "position": "bialibi"},
    # TAPE on full attention; a converted source starts as itself (identity states over its position table).
    "tape": {"attention": "full", "position": "tape", "tape_init": "identity", "position_extension": "taper"},
}


@strict
class LongBirdConfig(PreTrainedConfig):
    """Configuration of a longbird encoder (model_type "longbird").

    `source_max_positions` (L) is the number of usable learned positions of the source model;
    `max_position_embeddings` is the target length. With attention "bigbird", inputs of length
    <= `full_attention_max_length` (default L) use full attention, longer ones block-sparse attention.
    """

    model_type = "longbird"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.0
    max_position_embeddings: int = 4096
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    embedding_size: int | None = None
    classifier_dropout: float | int | None = None
    tie_word_embeddings: bool = True
    # Where the weights came from.
    source_model_type: str = "bert"
    source_max_positions: int = 512
    add_pooling_layer: bool = True
    lm_head_act: str | None = None
    # Method choices.
    attention: str = "bigbird"
    position: str = "absolute"
    position_extension: str = "taper"
    # Chosen by experiment E3 (experiments/results/e3_extrapolation.md): unattenuated repetition ("copy")
    # extrapolated best from 512-token fine-tuning; "exp"/"power" attenuate as KoBigBird-large's TAPER.
    taper_schedule: str = "copy"
    taper_mode: str = "scale"
    taper_tau: float | int = 2.0
    # The first source row the repetitions beyond the source length repeat (positions/taper.py): 0 repeats them all;
    # a QA reader can keep its question rows (0..start-1) out of the document's repeated positions.
    taper_start: int = 0
    block_size: int = 64
    num_random_blocks: int = 3
    full_attention_max_length: int | None = None
    random_seed: int = 0
    # "seeded": random blocks drawn per (layer, length) from random_seed, the same in training and inference.
    # "transformers": random blocks = block 0 and full attention up to max(L, (5 + 2r)·b), which is what an exported
    # transformers.BigBirdModel computes at inference (docs/kobigbird.md, "Random-block plans and the `transformers`
    # export").
    random_blocks: str = "seeded"
    # Which blocks are global (attention/patterns.py): "itc" is BigBird ITC (first and last block, both ways);
    # "first-reads-source": only the first block is global, and its queries (a reader's question) read the first
    # full_attention_max_length tokens, as in the source model. Chosen for a converted QA reader by E7's probe.
    global_blocks: str = "itc"
    # The middle blocks' local windows (attention/patterns.py): "sliding" is BigBird's {i-1, i, i+1}; "source-chunks"
    # tiles the blocks after block 0 into windows of the source's length that read block 0 and themselves, so every
    # chunk reads its (TAPER-copied) positions in order as the source did (E7 round 5).
    local_windows: str = "sliding"
    pack_size: int = 64
    bialibi_learnable: bool = True
    # TAPE (position="tape"): "identity" states (e = 1) keep a converted source's absolute position table and equal
    # the source at init; "rope" states (angles p·θ_f) replace the table, for models trained from scratch.
    tape_init: str = "identity"
    tape_channels: int | None = None  # I, the feed-forward side's channels (default 4 x heads)
    tape_rope_base: float | int = 10000.0
    # The content-driven phase of the states (positions/tape.py, TapePhase; gate zero at init). False keeps the states
    # real-only, which with identity init is a learned attention gain and no position code (E6's "gain-only" row).
    tape_phase: bool = True
    # Pack attention's output projection: "shared" with unpack attention (LittleBird §3.4: pack attention has its own
    # Q/K/V only; the paper's model sizes fit exactly three extra h x h matrices per layer) or "separate".
    pack_output_projection: str = "shared"
    # Sparse kernel: "auto" (compiled flex_attention on CUDA and for long fp32 CPU inference of LittleBird, else
    # blocked), "blocked", "flex"; see dispatch.py. Computes the same function either way.
    attention_backend: str = "auto"
    # Task heads.
    qa_head: str = "conditional"
    qa_top_k: int = 5
    # The longest answer span decoding considers, in tokens (`--max-answer-tokens` at fine-tuning sets it; `answer`
    # and `evaluate` can override it per call).
    qa_max_answer_tokens: int = 64
    # Regional nulls (data/null_regions.py): a [CLS] with position 0 before every qa_null_every-th document token past
    # the first full_attention_max_length tokens of a QA window; the start loss and the scoring are then per region.
    # 0: one null per window (the [CLS]), as the source reader was trained.
    qa_null_every: int = 0
    # With regional nulls, the weight w of the cross-region ranking term in the start loss ((1 - w) per-region loss +
    # w ranking; region_losses.py `cross_region_ranking_loss`, E7 round 10). 0: the per-region loss alone. A training
    # setting.
    qa_ranking_weight: float = 0.0
    # Linked windows (linked_windows.py, E7 round 13): sliding windows of one document read in one batch, whose [CLS]
    # states read each other's in every layer through a gated residual (zero at init: the model reads as unlinked).
    # The rows of a document are named by the forward's `document_ids`; without them every row is its own document.
    # With qa_ranking_weight the start loss ranks null-relative scores across the windows of a document.
    linked_windows: bool = False
    # The window selector (window_selector.py, E7 round 15): a head on each linked window's [CLS] that corrects its
    # null-relative "answer here" score, trained with this weight by one softmax per document over its windows and
    # added to every span's null-relative score at decoding. 0: no selector (no parameters).
    qa_selector_weight: float = 0.0

    def __post_init__(self, **kwargs):
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        if self.full_attention_max_length is None:
            self.full_attention_max_length = self.source_max_positions
        if self.tape_channels is None:
            self.tape_channels = 4 * self.num_attention_heads  # TAPE's default I = 4H
        super().__post_init__(**kwargs)

    @property
    def full_attention_threshold(self) -> int:
        """Rows (real tokens) at or below this length use full attention; longer rows the sparse pattern."""
        if self.random_blocks == "transformers":  # transformers' BigBirdModel: full up to (5 + 2r)·b tokens
            return max(self.full_attention_max_length, (5 + 2 * self.num_random_blocks) * self.block_size)
        return self.full_attention_max_length

    @property
    def pattern_arguments(self) -> tuple[int, bool, int]:
        """`global_blocks` and `local_windows` as the BigBird pattern's (first_block_reach, last_global,
        chunk_blocks)."""
        return pattern_arguments(self.global_blocks, self.local_windows, self.block_size,
                                 self.full_attention_max_length)

    @property
    def sparse_kernel(self) -> str:
        """Which sparse kernel the layers run, as `dispatch.choose_backend` names it: "usw" (LittleBird's sliding
        window) or "bigbird" (BigBird rows; also what a full-attention model would run)."""
        return "usw" if self.attention == "littlebird" else "bigbird"

    @property
    def uses_position_table(self) -> bool:
        """A learned absolute position table: absolute positions, and TAPE over a converted source (identity init)."""
        return self.position == "absolute" or (self.position == "tape" and self.tape_init == "identity")

    @property
    def has_lm_head(self) -> bool:
        return self.lm_head_act is not None

    def validate_architecture(self):
        """Part of `@strict` validation: every error names the value and the fix."""
        for field in dataclasses.fields(self):  # a number given as text ("64") would fail below as '<' on a str
            value, kinds = getattr(self, field.name), NUMBER_FIELDS.get(str(field.type))
            if kinds and not (isinstance(value, kinds) and not isinstance(value, bool)):
                raise ValueError(f"{field.name} must be {'an integer' if kinds == (int,) else 'a number'}"
                                 f"{' or None' if type(None) in kinds else ''}; got {value!r}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1; got {self.block_size} (the papers use 64)")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for name, allowed in (("attention", ATTENTIONS), ("position", POSITIONS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
            if value in NOT_YET_AVAILABLE[name]:
                raise ValueError(f"{name}={value!r} is not implemented in this version of longbird; use one of "
                                 f"{tuple(v for v in allowed if v not in NOT_YET_AVAILABLE[name])}")
        if self.position_extension not in POSITION_EXTENSIONS:
            raise ValueError(f"position_extension must be one of {POSITION_EXTENSIONS}; "
                             f"got {self.position_extension!r}")
        if self.max_position_embeddings < self.source_max_positions:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) is below the source length "
                f"({self.source_max_positions}); use max_length >= {self.source_max_positions}"
            )
        if (self.position == "bialibi" and self.attention != "littlebird") or (
                self.attention == "littlebird" and self.position not in ("bialibi", "tape")):
            raise ValueError(
                f"position='bialibi' needs attention='littlebird', and littlebird takes position 'bialibi' or 'tape' "
                f"(the USW kernel computes the BiALiBi bias); got attention={self.attention!r}, "
                f"position={self.position!r}"
            )
        if self.position == "tape":
            if self.tape_init not in TAPE_INITS:
                raise ValueError(f"tape_init must be one of {TAPE_INITS}; got {self.tape_init!r}")
            if (self.hidden_size // self.num_attention_heads) % 2:
                raise ValueError("TAPE needs an even head dimension; "
                                 f"got {self.hidden_size // self.num_attention_heads}")
        if self.attention in ("bigbird", "littlebird") and (
            self.block_size < 1 or self.max_position_embeddings % self.block_size != 0
        ):
            block = max(self.block_size, 1)
            raise ValueError(
                f"max_length ({self.max_position_embeddings}) must be a multiple of block_size ({self.block_size}); "
                f"use max_length={-(-self.max_position_embeddings // block) * block} when converting, or a block_size "
                f"that divides {self.max_position_embeddings}"
            )
        if self.attention == "littlebird" and not 0 <= self.pack_size <= self.max_position_embeddings:
            raise ValueError(f"pack_size ({self.pack_size}) must lie in 0..max_length "
                             f"({self.max_position_embeddings}); use 0 to disable pack attention or the paper's 64")
        if self.attention == "bigbird" and self.num_random_blocks < 0:
            raise ValueError(f"num_random_blocks must be >= 0; got {self.num_random_blocks}")
        if self.random_blocks not in RANDOM_BLOCK_PLANS:
            raise ValueError(f"random_blocks must be one of {RANDOM_BLOCK_PLANS}; got {self.random_blocks!r}")
        if self.global_blocks not in GLOBAL_BLOCKS:
            raise ValueError(f"global_blocks must be one of {GLOBAL_BLOCKS}; got {self.global_blocks!r}")
        if self.local_windows not in LOCAL_WINDOWS:
            raise ValueError(f"local_windows must be one of {LOCAL_WINDOWS}; got {self.local_windows!r}")
        if self.local_windows != "sliding" and self.attention != "bigbird":
            raise ValueError(f"local_windows={self.local_windows!r} is a BigBird pattern and this model has "
                             f"attention={self.attention!r}; use local_windows='sliding'")
        if self.local_windows != "sliding":
            if self.random_blocks == "transformers":
                raise ValueError("local_windows='source-chunks' is not transformers' BigBird pattern; use "
                                 "random_blocks='seeded' with it, or local_windows='sliding' for a transformers export")
            if self.full_attention_max_length % self.block_size or self.full_attention_max_length < 2 * self.block_size:
                raise ValueError(f"local_windows='source-chunks' tiles windows of full_attention_max_length "
                                 f"({self.full_attention_max_length}) tokens, which must be a multiple of block_size "
                                 f"({self.block_size}) and at least two blocks; use a block size that divides it")
        if self.global_blocks != "itc" and self.attention == "bigbird":
            if self.random_blocks == "transformers":
                raise ValueError("global_blocks='first-reads-source' is not transformers' BigBird pattern; use "
                                 "random_blocks='seeded' with it, or global_blocks='itc' for a transformers export")
            if self.full_attention_max_length % self.block_size:
                raise ValueError(f"global_blocks='first-reads-source' needs full_attention_max_length "
                                 f"({self.full_attention_max_length}) to be a multiple of block_size "
                                 f"({self.block_size}); use a block size that divides it")
        if self.pack_output_projection not in ("shared", "separate"):
            raise ValueError("pack_output_projection must be 'shared' or 'separate'; "
                             f"got {self.pack_output_projection!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}; got {self.attention_backend!r}")
        if self.qa_head not in QA_HEADS:
            raise ValueError(f"qa_head must be one of {QA_HEADS}; got {self.qa_head!r}")
        if self.qa_top_k < 1:
            raise ValueError(f"qa_top_k must be >= 1; got {self.qa_top_k}")
        if self.qa_max_answer_tokens < 1:
            raise ValueError(f"qa_max_answer_tokens must be >= 1; got {self.qa_max_answer_tokens}")
        if not 0 <= self.qa_ranking_weight <= 1:
            raise ValueError(f"qa_ranking_weight must lie in [0, 1]; got {self.qa_ranking_weight}")
        if self.qa_ranking_weight and not (self.qa_null_every or self.linked_windows):
            raise ValueError("qa_ranking_weight ranks spans across regional nulls or linked windows, and this model "
                             "has neither (qa_null_every=0, linked_windows=False): set one or qa_ranking_weight=0")
        if not 0 <= self.qa_selector_weight <= 1:
            raise ValueError(f"qa_selector_weight must lie in [0, 1]; got {self.qa_selector_weight}")
        if self.qa_selector_weight and not self.linked_windows:
            raise ValueError("qa_selector_weight trains a selector over the linked windows of a document, and this "
                             "model has none (linked_windows=False): set linked_windows=true or qa_selector_weight=0")
        if self.linked_windows and self.attention == "littlebird":
            raise ValueError("linked_windows links the [CLS] states of windows read with full or BigBird attention; "
                             "LittleBird's layers carry pack states instead: use preset full or kobigbird")
        if self.qa_null_every < 0:
            raise ValueError(f"qa_null_every must be >= 0 (0: no regional nulls); got {self.qa_null_every}")
        if self.qa_null_every and (not self.uses_position_table or self.attention == "littlebird"):
            # a null takes position 0 deep in the window: a learned table reads that as the [CLS] row, but BiALiBi
            # and RoPE-initialised TAPE states take distances from the position ids, and the null would sit thousands
            # of tokens away. Identity-initialised TAPE keeps the source's table and starts its states at e = 1 for
            # every token (positions/tape.py), so a null there is read as with absolute positions.
            raise ValueError(f"qa_null_every needs a position table (absolute positions, or TAPE with "
                             f"tape_init='identity') and bigbird or full attention; this model has "
                             f"position={self.position!r}, tape_init={self.tape_init!r}, attention={self.attention!r}: "
                             f"set qa_null_every=0")


def validated(config: LongBirdConfig) -> LongBirdConfig:
    """`config`, checked as a whole once more, or ValueError with longbird's own message. `@strict` checks a config
    when it is built, but transformers applies `from_pretrained(path, block_size=48)` and the like with setattr
    afterwards, so the models check again when they are built: a model that runs but cannot be saved (save_pretrained
    validates) is the worst outcome."""
    try:
        config.validate()
    except StrictDataclassError as error:  # our message, not the validator wrapper's
        raise ValueError(str(error.__cause__ or error)) from error
    return config

