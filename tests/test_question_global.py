"""The question stays global in sparse windows (issue 24): it is cut to fit the first block, which is global in
BigBird ITC and LittleBird, so every document token reads every question token; a token past the first block would
be read only by its neighbours (shown on one-layer models without random blocks)."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB
from transformers import BertConfig, BertModel

import longbird
from longbird.data.features import question_token_cap, question_token_limit


def one_layer(attention: str, length: int = 256, block: int = 8):
    torch.manual_seed(0)
    source = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)).eval()
    preset = {"bigbird": "kobigbird", "littlebird": "littlebird"}[attention]
    extra = {"num_random_blocks": 0} if attention == "bigbird" else {}
    return longbird.convert(source, preset=preset, max_length=length, block_size=block, **extra).eval()


def test_the_limit_keeps_the_question_in_the_first_block_of_sparse_windows_only():
    bigbird, littlebird = one_layer("bigbird"), one_layer("littlebird")
    assert question_token_limit(bigbird.config, 64) == 64  # full attention up to the source length: no cut
    assert question_token_limit(bigbird.config, 65) == 7  # sparse: [CLS] + 7 question tokens fill block 0
    assert question_token_limit(littlebird.config, 64, tokens_before_question=2) == 6
    real = bigbird.config.__class__(**{**bigbird.config.to_dict(), "block_size": 64})
    assert question_token_limit(real, 4096) == 63  # multilingual-e5-small's longest KorQuAD question: 59 tokens
    # the default (64) is only a default where attention is full: an explicit longer question is not capped there
    assert question_token_cap(bigbird.config, 64) is None and question_token_cap(bigbird.config, 65) == 7


@pytest.mark.parametrize("attention", ["bigbird", "littlebird"])
def test_a_far_token_reads_every_question_token_in_the_first_block_and_not_one_beyond(attention):
    model = one_layer(attention)
    length, block = 256, model.config.block_size
    ids = torch.randint(5, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))
    far = length - 2 * block - 3  # a middle-block token, far from the start (not in any window of block 0 or 1)

    def far_output_after_changing(position: int) -> torch.Tensor:
        changed = ids.clone()
        changed[0, position] = 5 if int(ids[0, position]) != 5 else 6
        with torch.no_grad():
            return model(input_ids=changed).last_hidden_state[0, far]

    with torch.no_grad():
        base = model(input_ids=ids).last_hidden_state[0, far]
    for position in range(1, block):  # the question's places under the limit: every one reaches the far token
        assert (far_output_after_changing(position) - base).abs().max() > 1e-6, position
    if attention == "bigbird":  # the first token of block 1 (where a 64-token question spills at block 64) does not
        torch.testing.assert_close(far_output_after_changing(block), base, atol=0, rtol=0)
    # (LittleBird's far tokens also read every token through the s packed keys of pack & unpack attention: a
    # summary, not the token itself, so a token past block 0 still changes them a little.)


def test_answer_refuses_more_question_tokens_than_the_first_block_holds(tmp_path):
    from test_qa_cli import write_tiny_source
    from transformers import AutoTokenizer

    from longbird.tasks.qa import answer

    source = write_tiny_source(tmp_path / "source")
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = longbird.LongBirdForQuestionAnswering(
        longbird.convert(str(source), max_length=256, block_size=16).config)
    with pytest.raises(ValueError, match="at most 15 question tokens fit there; give 15 or fewer"):
        answer(model, document="a document " * 100, question="what?", tokenizer=tokenizer, window_length=256, max_question_tokens=40)
    record = answer(model, document="a document " * 100, question="what is " * 30, tokenizer=tokenizer, window_length=256)
    assert record["question_cut"] == {"tokens": 60, "read": 15}
