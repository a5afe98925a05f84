"""TAPE (issue 13, positions/tape.py): identity init equals the source, relative-position invariance and
permutation/rotation equivariance with non-zero TAPE weights, every kernel against the dense reference, batch
independence, and the configuration errors."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import longbird
from longbird.config import LongBirdConfig
from longbird.modeling import LongBirdModel
from longbird.positions import tape
from conftest import BLOCK, SOURCE_LENGTH, assert_same_outputs_and_gradients, make_batch, make_source

KERNELS = {"full": {}, "bigbird": {"block_size": BLOCK, "num_random_blocks": 2},
           "littlebird": {"block_size": BLOCK, "pack_size": 8}}
EXACT_AT_SOURCE_LENGTH = ("full", "bigbird")  # littlebird's window and BiALiBi differ from the source by design


def _perturb_tape(model, seed=0):
    """Non-zero TAPE weights in every layer (at init they are zero, which would make the tests below trivial)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "tape_" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def _rope_model(attention="full", seed=0):
    torch.manual_seed(seed)
    config = LongBirdConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=256, source_max_positions=SOURCE_LENGTH,
                            attention=attention, position="tape", tape_init="rope", hidden_dropout_prob=0.0,
                            initializer_range=0.2,  # logits large enough that positions matter visibly
                            **KERNELS[attention])
    return _perturb_tape(LongBirdModel(config).eval(), seed)


@pytest.mark.parametrize("attention", EXACT_AT_SOURCE_LENGTH)
@pytest.mark.parametrize("source_name", ["bert", "roberta", "electra"])
def test_identity_init_equals_the_source(attention, source_name):
    source = make_source(source_name)
    model = longbird.convert(source, preset="tape", max_length=256, attention=attention, **KERNELS[attention])
    assert model.config.position == "tape" and model.config.tape_init == "identity"
    assert sum(p.numel() for n, p in model.named_parameters() if "tape_" in n) > 0
    input_ids, attention_mask = make_batch(SOURCE_LENGTH - 3)
    if source_name != "bert":
        input_ids = input_ids.clamp(min=3)
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        theirs = source(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-4)


def test_rotation_by_states_gives_relative_logits():
    """Re⟨q ⊙ e_i, k ⊙ e_j⟩ with rope states depends on i − j only, and a rotation common to all states cancels."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 6, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    positions = torch.arange(6)[None]
    logits = lambda states: tape.rotate(q, states) @ tape.rotate(k, states).transpose(-1, -2)  # noqa: E731
    base = logits(tape.initial_states(positions, 2, 8, "rope", dtype=torch.float64))
    shifted = logits(tape.initial_states(positions + 1000, 2, 8, "rope", dtype=torch.float64))
    torch.testing.assert_close(base, shifted)
    states = torch.randn(1, 2, 6, 4, 2, generator=generator, dtype=torch.float64)  # any states, not only rope
    angle = torch.rand(4, generator=generator, dtype=torch.float64) * 2 * math.pi  # one unit complex per pair
    unit = torch.stack([angle.cos(), angle.sin()], -1)
    rotated = torch.stack([states[..., 0] * unit[:, 0] - states[..., 1] * unit[:, 1],
                           states[..., 0] * unit[:, 1] + states[..., 1] * unit[:, 0]], -1)
    torch.testing.assert_close(logits(states), logits(rotated))
    # identity states leave q and k exactly as they are
    identity = tape.initial_states(positions, 2, 8, "identity", dtype=torch.float64)
    assert torch.equal(tape.rotate(q, identity), q)


@pytest.mark.parametrize("attention", EXACT_AT_SOURCE_LENGTH)  # BiALiBi treats position 0 (CLS) apart: not shiftable
def test_shifting_every_position_id_changes_nothing(attention):
    """rope init, non-zero TAPE weights in every layer: position ids + c give the same outputs (relative positions
    only), at a length where bigbird runs its sparse kernel."""
    model = _rope_model(attention)
    input_ids, attention_mask = make_batch(150)
    positions = torch.arange(150).expand(2, -1)
    with torch.no_grad():
        base = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
        for shift in (1, 37, 5000):
            moved = model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=positions + shift).last_hidden_state
            real = attention_mask.bool()
            torch.testing.assert_close(moved[real], base[real], atol=1e-4, rtol=1e-4)
    assert (base[0] - model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=positions.flip(-1)).last_hidden_state[0].detach()).abs().max() > 1e-3


def test_layer_updates_are_permutation_and_rotation_equivariant():
    """One full-attention layer: permuting tokens (with their states) permutes the hidden outputs and the updated
    states; rotating every state by one unit complex per pair rotates the updated states and leaves hidden alone."""
    model = _rope_model("full")
    layer = model.encoder.layer[0]
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 12, 32, generator=generator)
    states = torch.randn(1, 4, 12, 4, 2, generator=generator)
    mask = torch.ones(1, 12, dtype=torch.bool)
    with torch.no_grad():
        out, new_states = layer(hidden, mask, None, False, {}, None, states)
        order = torch.randperm(12, generator=generator)
        out_p, states_p = layer(hidden[:, order], mask, None, False, {}, None, states[:, :, order])
        torch.testing.assert_close(out_p, out[:, order], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states_p, new_states[:, :, order], atol=1e-5, rtol=1e-5)
        angle = torch.rand(4, generator=generator) * 2 * math.pi
        c, s = angle.cos(), angle.sin()
        rotate = lambda e: torch.stack([e[..., 0] * c - e[..., 1] * s, e[..., 0] * s + e[..., 1] * c], -1)  # noqa
        out_r, states_r = layer(hidden, mask, None, False, {}, None, rotate(states))
        torch.testing.assert_close(out_r, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states_r, rotate(new_states), atol=1e-5, rtol=1e-5)
    assert (new_states - states).abs().max() > 1e-3  # the updates are not zero


@pytest.mark.parametrize("pack_size", [0, 8])
def test_littlebird_layer_is_rotation_equivariant_with_pack_keys(pack_size):
    """USW + pack attention with TAPE: rotating every token state by one unit complex per pair leaves the hidden
    output and the pack unchanged and rotates the updated states (packed keys read the plain query and carry zero
    states, so nothing position-free breaks the symmetry); the states really change and really reach the output."""
    torch.manual_seed(0)
    config = LongBirdConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=256, source_max_positions=SOURCE_LENGTH,
                            attention="littlebird", position="tape", tape_init="rope", hidden_dropout_prob=0.0,
                            initializer_range=0.2, block_size=BLOCK, pack_size=pack_size)
    model = _perturb_tape(LongBirdModel(config).eval())
    layer = model.encoder.layer[0]
    assert not hasattr(layer.pack_attention.self, "tape_post") if pack_size else layer.pack_attention is None
    generator = torch.Generator().manual_seed(1)
    length = 4 * BLOCK
    hidden = torch.randn(1, length, 32, generator=generator)
    pack = torch.randn(1, pack_size, 32, generator=generator) if pack_size else None
    states = torch.randn(1, 4, length, 4, 2, generator=generator)
    mask = torch.ones(1, length, dtype=torch.bool)
    positions = torch.arange(length)[None]
    angle = torch.rand(4, generator=generator) * 2 * math.pi
    c, s = angle.cos(), angle.sin()
    rotate = lambda e: torch.stack([e[..., 0] * c - e[..., 1] * s, e[..., 0] * s + e[..., 1] * c], -1)  # noqa
    with torch.no_grad():
        for reference in (False, True):
            out, new_pack, new_states = layer(hidden, mask, positions, pack, use_reference=reference, tape=states)
            out_r, pack_r, states_r = layer(hidden, mask, positions, pack, use_reference=reference,
                                            tape=rotate(states))
            torch.testing.assert_close(out_r, out, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(states_r, rotate(new_states), atol=1e-5, rtol=1e-5)
            if pack_size:
                torch.testing.assert_close(pack_r, new_pack)
        other, _, _ = layer(hidden, mask, positions, pack, tape=torch.randn(states.shape, generator=generator))
    assert (new_states - states).abs().max() > 1e-3 and (other - out).abs().max() > 1e-3


@pytest.mark.parametrize("init", ["identity", "rope"])
@pytest.mark.parametrize("attention", list(KERNELS))
@pytest.mark.parametrize("length", [9, 64, 65, 150])
def test_kernels_with_tape_equal_the_dense_reference(attention, length, init):
    """Outputs and every gradient, from identity states (turned complex by the perturbed phase gates) and from rope
    states (distinct angles per pair from the first layer on)."""
    model = longbird.convert(make_source("bert"), preset="tape", max_length=256, attention=attention,
                             tape_init=init, **KERNELS[attention])
    _perturb_tape(model)
    reference = copy.deepcopy(model)
    reference.config._attn_implementation = "reference"
    assert_same_outputs_and_gradients(model.train(), reference.train(), *make_batch(length))
    for part in ("tape_post", "tape_ffn_in", "tape_phase_gate", "tape_phase_clock"):
        assert any(p.grad is not None and p.grad.abs().max() > 0 for n, p in model.named_parameters() if part in n)


@pytest.mark.parametrize("attention", EXACT_AT_SOURCE_LENGTH)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tape_attention_on_the_cpu_runs_sdpas_fused_kernel(attention, dtype, monkeypatch):
    """With the states beside V, V is twice as wide as Q and K, and SDPA's CPU dispatch then takes its math path, which
    stores every score (a 4K-token TAPE + BigBird forward ran 4.7x slower than its kobigbird twin that way). Q and K
    are padded to V's width with zero columns (`attention.full.as_wide_as_value`), so every attention call of a TAPE
    forward, dense and blocked, runs the fused kernel; the values against the dense reference are the test above.
    (longbird's own bf16 CPU kernel, which would take the blocked calls in bf16, is switched off here: this is about
    SDPA's dispatch; tests/test_cpu_kernel.py covers that kernel.)"""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")

    model = longbird.convert(make_source("bert"), preset="tape", max_length=256, attention=attention,
                             **KERNELS[attention]).eval()
    _perturb_tape(model)
    input_ids, attention_mask = make_batch(150)  # past the source length: BigBird runs its blocked kernel
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16), \
            profile(activities=[ProfilerActivity.CPU]) as trace:
        model(input_ids=input_ids, attention_mask=attention_mask)
    calls = {event.key: event.count for event in trace.key_averages() if "scaled_dot_product" in event.key}
    assert not any("math" in name for name in calls), calls
    assert sum(count for name, count in calls.items() if "flash" in name) >= model.config.num_hidden_layers, calls


def _states_after_each_layer(model, input_ids, attention_mask):
    """The TAPE states each layer hands to the next (its output's last element)."""
    seen = []
    hooks = [layer.register_forward_hook(lambda module, args, output: seen.append(output[-1].detach()))
             for layer in model.encoder.layer]
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@pytest.mark.parametrize("attention", list(KERNELS))
def test_identity_states_acquire_phase_and_differ_across_pairs(attention):
    """Issue 26: from e = 1 with non-zero TAPE weights the states leave the real line and differ across frequency
    pairs from the second layer on; without the phase (tape_phase=False, the "gain-only" form) they stay real and
    equal across pairs in every layer, whatever the other TAPE weights are: a gain, not a position code."""
    input_ids, attention_mask = make_batch(150)
    real = attention_mask.bool()
    for phase in (True, False):
        model = longbird.convert(make_source("bert"), preset="tape", max_length=256, attention=attention,
                                 tape_phase=phase, **KERNELS[attention])
        assert model.config.tape_init == "identity"
        _perturb_tape(model)
        with torch.no_grad():
            states = _states_after_each_layer(model.eval(), input_ids, attention_mask)
        for layer, e in enumerate(states):
            e = e[:, :, :real.shape[1]].permute(0, 2, 1, 3, 4)[real]  # real tokens (the kernels pad to blocks)
            imaginary = e[..., 1].abs().max()
            spread = (e - e[:, :, :1]).abs().max()  # across frequency pairs
            if phase:
                assert imaginary > 1e-2 and spread > 1e-2, (layer, imaginary, spread)
            else:
                assert imaginary == 0 and spread == 0, (layer, imaginary, spread)


def test_the_phase_gate_learns_from_the_exact_start():
    """At conversion every TAPE map is at its exact start (the model equals its source), and still the loss reaches
    the phase gate of every layer: training can turn relative phase on."""
    model = longbird.convert(make_source("bert"), preset="tape", max_length=256).train()
    assert all(not layer.tape_phase.tape_phase_gate.any() for layer in model.encoder.layer)
    input_ids, attention_mask = make_batch(150)
    model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.square().mean().backward()
    for layer in model.encoder.layer:
        assert layer.tape_phase.tape_phase_gate.grad.abs().max() > 0


@pytest.mark.parametrize("attention", list(KERNELS))
def test_each_row_equals_the_row_alone(attention):
    # float64: fp32 sums blocked differently for a batch than for one row differ in the last bits, and with the phase
    # rotation and large logits (initializer_range 0.2) three layers amplify those to ~2e-6; a row that really read
    # another row would differ by O(1), far above float64 rounding
    model = _rope_model(attention).double()
    lengths = [9, 65, 150, 149]
    input_ids = torch.randint(5, 99, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(2))
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        attention_mask[row, :length] = 1
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        for row, length in enumerate(lengths):
            alone = model(input_ids=input_ids[row:row + 1, :length]).last_hidden_state
            torch.testing.assert_close(batched[row, :length], alone[0], atol=1e-6, rtol=1e-5)


def test_tape_configuration_errors():
    source = make_source("bert")
    with pytest.raises(ValueError, match="tape_init must be one of"):
        longbird.convert(source, preset="tape", max_length=128, tape_init="sinusoid")
    with pytest.raises(Exception, match="littlebird takes position 'bialibi' or 'tape'"):
        LongBirdConfig(attention="littlebird", position="absolute")
    with pytest.raises(Exception, match="even head dimension"):
        LongBirdConfig(position="tape", attention="full", hidden_size=36, num_attention_heads=4)
    rope = LongBirdConfig(position="tape", attention="full", tape_init="rope")
    assert not rope.uses_position_table and LongBirdConfig(position="tape", attention="full").uses_position_table
    assert rope.tape_channels == 4 * rope.num_attention_heads


@pytest.mark.parametrize("layer_norms", [False, True])
def test_peft_trains_exactly_tape_layer_norms_and_the_head(layer_norms):
    from longbird.heads import LongBirdForQuestionAnswering, LongBirdForSequenceClassification
    from longbird.training.peft import tape_peft

    source = make_source("bert")
    base = longbird.convert(source, preset="tape", max_length=256, attention="bigbird", **KERNELS["bigbird"])
    model = LongBirdForQuestionAnswering(base.config)
    model.longbird.load_state_dict(base.state_dict())
    _perturb_tape(model)
    trainable = tape_peft(model, layer_norms=layer_norms)
    for name, parameter in model.named_parameters():
        expected = "tape_" in name or not name.startswith("longbird.") or (layer_norms and "LayerNorm" in name)
        assert parameter.requires_grad == expected, name
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(trainable)
    # both TAPE updates receive gradients (the attention side's W_post too), frozen weights none
    input_ids, attention_mask = make_batch(150)
    out = model(input_ids=input_ids, attention_mask=attention_mask, start_positions=torch.tensor([3, 5]),
                end_positions=torch.tensor([4, 9]))
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(grads[n] is None for n, p in model.named_parameters() if not p.requires_grad)
    for part in ("attention.self.tape_post", "tape_ffn.tape_ffn_in", "tape_ffn.tape_ffn_out", "tape_ffn.tape_ffn_gate"):
        assert any(part in n and grads[n] is not None and grads[n].abs().max() > 0 for n in grads), part
    # a bare model: only TAPE (and LayerNorms) train; a model without TAPE is refused
    assert all("tape_" in n or "LayerNorm" in n for n in tape_peft(copy.deepcopy(base), layer_norms=True))
    with pytest.raises(ValueError, match="--preset tape"):
        tape_peft(LongBirdForSequenceClassification(longbird.convert(source, max_length=256, block_size=BLOCK).config))


def test_peft_cli_checkpoint_holds_only_what_was_trained_and_round_trips(tmp_path):
    """finetune-qa --preset tape --peft tape: OUT holds the TAPE maps, the QA head and the added tag-token rows, not
    the model; `evaluate`/`answer` load it back into the full model (base converted again), equal to training's."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from longbird.cli import app
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.checkpoints import load_tape_peft
    from longbird.checkpoints import load_on_device
    from test_qa_cli import PAGES, write_tiny_source

    source = write_tiny_source(tmp_path / "source")
    out = tmp_path / "qa-peft"
    result = CliRunner().invoke(app, ["finetune-qa", "--model", str(source), "--preset", "tape", "--max-length", "128",
                                      "--train", str(PAGES[0]), "--out", str(out), "--max-steps", "2",
                                      "--batch-size", "2", "--peft", "tape", "--learning-rate", "1e-2"])
    assert result.exit_code == 0, result.output
    assert not (out / "model.safetensors").exists() and (out / "tape_peft.safetensors").is_file()
    saved = load_file(str(out / "tape_peft.safetensors"))
    assert all("tape_" in name or name.startswith("qa_") or name == "added_word_embeddings" for name in saved), sorted(saved)
    assert any("tape_post" in name for name in saved) and any("tape_ffn_in" in name for name in saved)
    record = json.loads((out / "longbird_peft.json").read_text())
    assert record["base"]["model"] == str(source.resolve()) and record["base"]["preset"] == "tape"
    model, tokenizer = load_on_device(out, LongBirdForQuestionAnswering)
    assert len(tokenizer) == model.get_input_embeddings().weight.shape[0]
    with torch.no_grad():  # the trained TAPE maps are back (they were zero/random before training)
        restored = dict(model.named_parameters())
        for name, tensor in saved.items():
            if name != "added_word_embeddings":
                torch.testing.assert_close(restored[name], tensor)
        assert any(restored[n].abs().max() > 0 for n in restored if "tape_ffn_in" in n)
    reloaded = load_tape_peft(out, LongBirdForQuestionAnswering)
    ids = torch.tensor([tokenizer("질문 [SEP] 문서", truncation=True)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).start_logits, reloaded(input_ids=ids).start_logits)
    # a record written before 2026-11-23 names the first added row "vocab_size" (the same row for this base)
    assert record["base"]["added_rows_from"] == len(AutoTokenizer.from_pretrained(source))
    record["base"]["vocab_size"] = record["base"].pop("added_rows_from")
    (out / "longbird_peft.json").write_text(json.dumps(record))
    with torch.no_grad():
        torch.testing.assert_close(load_tape_peft(out, LongBirdForQuestionAnswering)(input_ids=ids).start_logits,
                                   reloaded(input_ids=ids).start_logits)
    del record["base"]["vocab_size"]
    (out / "longbird_peft.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="neither 'added_rows_from' nor 'vocab_size'"):
        load_tape_peft(out, LongBirdForQuestionAnswering)
    bad = CliRunner().invoke(app, ["finetune-qa", "--model", str(source), "--train", str(PAGES[0]), "--out",
                                   str(tmp_path / "x"), "--peft", "lora"])
    assert bad.exit_code != 0 and "--peft must be 'tape'" in bad.output


def test_peft_checkpoint_of_a_base_with_spare_embedding_rows_round_trips(tmp_path):
    """A base whose embedding table has rows past its tokenizer (multilingual-e5-small: 250,037 for 250,002 pieces):
    the tag tokens land in those rows, the table keeps its size, and loading the PEFT checkpoint gives back the
    rows training saw (each tag row = the mean of its meaning's pieces), not the base's spare rows."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertModel
    from typer.testing import CliRunner

    from longbird.cli import app
    from longbird.conversion import default_source
    from longbird.data.html import TAG_TOKEN_MEANINGS, TAG_TOKENS
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.checkpoints import load_on_device
    from test_qa_cli import PAGES, write_tiny_source

    pieces = len(AutoTokenizer.from_pretrained(default_source(), local_files_only=True))
    source = write_tiny_source(tmp_path / "source", vocab_size=pieces + 40)
    base_table = BertModel.from_pretrained(source).get_input_embeddings().weight.detach()
    out = tmp_path / "qa-peft"
    result = CliRunner().invoke(app, ["finetune-qa", "--model", str(source), "--preset", "tape", "--max-length", "128",
                                      "--train", str(PAGES[0]), "--out", str(out), "--max-steps", "1",
                                      "--batch-size", "2", "--peft", "tape"])
    assert result.exit_code == 0, result.output
    assert load_file(str(out / "tape_peft.safetensors"))["added_word_embeddings"].shape[0] == 40
    model, tokenizer = load_on_device(out, LongBirdForQuestionAnswering)
    table = model.get_input_embeddings().weight.detach()
    assert table.shape[0] == pieces + 40  # grown never shrunk: the base's shape
    torch.testing.assert_close(table[:pieces], base_table[:pieces])
    for name, token in TAG_TOKENS.items():
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert pieces <= token_id < pieces + 40
        meaning = tokenizer(TAG_TOKEN_MEANINGS[name], add_special_tokens=False)["input_ids"]
        torch.testing.assert_close(table[token_id], base_table[meaning].mean(0))
    spare = pieces + len(TAG_TOKENS)  # a row no token uses stays the base's
    torch.testing.assert_close(table[spare:], base_table[spare:])
    # a checkpoint from before 2026-11-23, whose table was cut to the tokenizer, is refused by name
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "vocab_size": spare}))
    with pytest.raises(ValueError, match=f"fewer than the {pieces + 40} of its base.*fine-tune again"):
        load_on_device(out, LongBirdForQuestionAnswering)


# Conversion overrides a PEFT checkpoint must keep: the TAPER schedule and tau shape the frozen position rows past the
# source length, the BigBird settings (blocks of 16, transformers' random-block plan) the computation.
PEFT_OVERRIDES = {"taper_schedule": "exp", "taper_tau": 3.0, "attention": "bigbird", "block_size": 16,
                  "num_random_blocks": 1, "random_blocks": "transformers"}


def _trained_peft_checkpoint(model_path, out, preset="tape", max_length=256, **overrides):
    """A QA model loaded (or converted) as `finetune-qa --peft tape` does, its TAPE maps and head moved away from
    their init as training would, saved the way every training command saves a PEFT run (with the tokenizer)."""
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.training.finetune import FinetuneSettings
    from longbird.training.peft import tape_peft
    from longbird.runs import save_trained
    from longbird.checkpoints import load_task_model

    model, tokenizer = load_task_model(model_path, LongBirdForQuestionAnswering, preset, max_length, **overrides)
    tape_peft(model)
    _perturb_tape(model, seed=1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.startswith("qa_"):
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    out.mkdir()
    save_trained(model, out, FinetuneSettings(peft="tape"), model_path, preset, max_length)
    tokenizer.save_pretrained(out)
    return model.eval()


def _qa_logits(model, input_ids):
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    return torch.cat([out.start_logits, out.end_logits])


def test_peft_checkpoint_keeps_the_conversion_overrides_of_its_base(tmp_path):
    """A PEFT checkpoint of a base converted with config overrides rebuilds that base, not the preset's defaults: the
    reloaded model has the trained config and exactly the trained outputs on an input past the source length (and
    past the BigBird full-attention threshold), where exp rows differ from the default copy ones. A record without the
    conversion settings is refused, naming the cause and the fix; its escape hatch (`"conversion": {}`, a base
    converted with no overrides) reads it, and here shows what the settings prevent: another base, other outputs."""
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.checkpoints import load_task_model
    from test_qa_cli import write_tiny_source

    source = write_tiny_source(tmp_path / "source")
    out = tmp_path / "qa-peft"
    trained = _trained_peft_checkpoint(source, out, **PEFT_OVERRIDES)
    record = json.loads((out / "longbird_peft.json").read_text())
    conversion = record["base"]["conversion"]
    assert {key: conversion[key] for key in PEFT_OVERRIDES} == PEFT_OVERRIDES
    assert conversion["position"] == "tape" and conversion["max_position_embeddings"] == 256
    assert "vocab_size" not in conversion and "id2label" not in conversion  # grown by added tokens / head settings
    reloaded, tokenizer = load_task_model(out, LongBirdForQuestionAnswering)
    for key, value in PEFT_OVERRIDES.items():
        assert getattr(reloaded.config, key) == getattr(trained.config, key) == value, key
    assert reloaded.config.full_attention_threshold == (5 + 2 * 1) * 16 < 200
    position = "longbird.embeddings.position_embeddings.weight"
    assert torch.equal(dict(reloaded.named_parameters())[position], dict(trained.named_parameters())[position])
    input_ids = torch.randint(len(tokenizer), (2, 200), generator=torch.Generator().manual_seed(0))
    expected = _qa_logits(trained, input_ids)
    torch.testing.assert_close(_qa_logits(reloaded, input_ids), expected, rtol=0, atol=0)

    del record["base"]["conversion"]  # a record written before the conversion settings were kept
    (out / "longbird_peft.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"older longbird.*not the config overrides.*Re-run the --peft tape training"):
        load_task_model(out, LongBirdForQuestionAnswering)
    record["base"]["conversion"] = {}
    (out / "longbird_peft.json").write_text(json.dumps(record))
    defaults = load_task_model(out, LongBirdForQuestionAnswering)[0]
    assert defaults.config.taper_schedule == "exp"  # the config still says exp, but the rows are copy's
    assert not torch.equal(dict(defaults.named_parameters())[position], dict(trained.named_parameters())[position])
    assert not torch.allclose(_qa_logits(defaults, input_ids), expected)


def test_peft_checkpoint_of_a_converted_longbird_directory_round_trips_with_or_without_its_settings(tmp_path):
    """A base saved by `convert --set ...` is loaded, not converted: the new record (its settings given to
    from_pretrained) and a record without them both give back the trained model exactly."""
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.checkpoints import convert_to_directory, load_task_model
    from test_qa_cli import write_tiny_source

    source = write_tiny_source(tmp_path / "source")
    base = tmp_path / "tape-256"
    convert_to_directory(source, base, preset="tape", max_length=256, **PEFT_OVERRIDES)
    out = tmp_path / "qa-peft"
    trained = _trained_peft_checkpoint(base, out)
    input_ids = torch.randint(1000, (1, 200), generator=torch.Generator().manual_seed(0))
    expected = _qa_logits(trained, input_ids)
    record = json.loads((out / "longbird_peft.json").read_text())
    assert record["base"]["conversion"]["taper_schedule"] == "exp"
    torch.testing.assert_close(_qa_logits(load_task_model(out, LongBirdForQuestionAnswering)[0], input_ids), expected,
                               rtol=0, atol=0)
    del record["base"]["conversion"]
    (out / "longbird_peft.json").write_text(json.dumps(record))
    torch.testing.assert_close(_qa_logits(load_task_model(out, LongBirdForQuestionAnswering)[0], input_ids), expected,
                               rtol=0, atol=0)


def test_peft_checkpoint_of_a_littlebird_tape_base_reloads_exactly(tmp_path):
    """The pack vectors of a LittleBird base are created by conversion and stay frozen under TAPE PEFT, so the
    checkpoint does not hold them: conversion draws them from a fixed seed, so the rebuilt base is the trained one
    and the reloaded model gives exactly the trained outputs (at a length where the packed keys are read)."""
    from longbird.heads import LongBirdForQuestionAnswering
    from longbird.checkpoints import load_task_model
    from test_qa_cli import write_tiny_source

    source = write_tiny_source(tmp_path / "source")
    out = tmp_path / "qa-peft"
    torch.manual_seed(7)  # another global random state than the reload's: it must not matter
    trained = _trained_peft_checkpoint(source, out, attention="littlebird", block_size=16, pack_size=4)
    assert "longbird.encoder.pack_embeddings" not in json.loads((out / "longbird_peft.json").read_text())["trained"]
    torch.manual_seed(8)
    reloaded, tokenizer = load_task_model(out, LongBirdForQuestionAnswering)
    pack = "longbird.encoder.pack_embeddings"
    assert torch.equal(dict(reloaded.named_parameters())[pack], dict(trained.named_parameters())[pack])
    input_ids = torch.randint(len(tokenizer), (2, 200), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_qa_logits(reloaded, input_ids), _qa_logits(trained, input_ids), rtol=0, atol=0)


def test_a_checkpoint_saved_before_the_phase_existed_loads_as_it_was(tmp_path):
    """A TAPE model saved without `tape_phase_*` tensors (written before issue 26) loads with the gate at zero, which
    is the earlier real-only model exactly, whatever its other TAPE weights were."""
    from safetensors.torch import load_file, save_file

    model = _perturb_tape(longbird.convert(make_source("bert"), preset="tape", max_length=256))
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.tape_phase.tape_phase_gate.zero_()  # what that model computed: no phase
    model.eval().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    old = {name: tensor for name, tensor in load_file(weights).items() if "tape_phase" not in name}
    save_file(old, weights, metadata={"format": "pt"})
    loaded = LongBirdModel.from_pretrained(tmp_path).eval()
    assert all(not layer.tape_phase.tape_phase_gate.any() for layer in loaded.encoder.layer)
    input_ids, attention_mask = make_batch(100)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state,
                           model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)


@pytest.mark.parametrize("trained_as", ["LongBirdModel", "LongBirdForSpanSelection"])
def test_a_peft_checkpoint_of_distill_or_pretrain_loads_into_another_head(tmp_path, trained_as):
    """`distill --peft tape` trains a bare encoder (names without the heads' `longbird.` prefix) and `pretrain --peft
    tape` the span-selection head: both directories were refused by every later command ('does not fit its base',
    or 'LongBirdModel' object has no attribute 'longbird'). The trained TAPE maps carry over into a QA head and into
    the encoder alone; the pretraining head's own parameters stay behind."""
    import longbird.heads as heads
    from longbird.checkpoints import load_task_model, load_tape_peft
    from longbird.modeling import LongBirdModel
    from longbird.runs import save_trained
    from longbird.training.finetune import FinetuneSettings
    from longbird.training.peft import tape_peft
    from test_qa_cli import write_tiny_source

    source = write_tiny_source(tmp_path / "source")
    task_class = LongBirdModel if trained_as == "LongBirdModel" else heads.LongBirdForSpanSelection
    model, _ = load_task_model(source, task_class, "tape", 256)
    tape_peft(model)
    _perturb_tape(model, seed=3)
    (tmp_path / "peft").mkdir()
    save_trained(model, tmp_path / "peft", FinetuneSettings(peft="tape"), source, "tape", 256)
    trained = getattr(model, "longbird", model).state_dict()
    tape_names = [name for name in trained if "tape_" in name]
    assert tape_names
    for target in (heads.LongBirdForQuestionAnswering, LongBirdModel):
        loaded = load_tape_peft(tmp_path / "peft", target)
        state = getattr(loaded, "longbird", loaded).state_dict()
        for name in tape_names:
            torch.testing.assert_close(state[name], trained[name], rtol=0, atol=0)
