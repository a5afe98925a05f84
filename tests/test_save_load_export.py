"""save_pretrained/from_pretrained round trips, Auto classes, hf-bigbird export, atomic writes."""

import time

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering, BigBirdForMaskedLM, BigBirdModel

import longbird
from longbird.export import export
from longbird.files import write_directory_atomically
from conftest import BLOCK, make_batch, make_source


@pytest.mark.parametrize("name", ["bert", "roberta-mlm", "electra"])
def test_save_load_round_trip_is_exact(tmp_path, name):
    model = longbird.convert(make_source(name), max_length=256, block_size=BLOCK, num_random_blocks=2)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    auto = AutoModelForMaskedLM if name.endswith("mlm") else AutoModel
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    for (key, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), key
    input_ids, attention_mask = make_batch(200, pad_id=model.config.pad_token_id)
    with torch.no_grad():
        first = model(input_ids=input_ids, attention_mask=attention_mask)
        second = loaded(input_ids=input_ids, attention_mask=attention_mask)
    key = "logits" if name.endswith("mlm") else "last_hidden_state"
    assert torch.equal(first[key], second[key])


def test_task_heads_load_from_a_converted_base(tmp_path):
    longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK).save_pretrained(tmp_path)
    qa = AutoModelForQuestionAnswering.from_pretrained(tmp_path)
    input_ids, attention_mask = make_batch(100)
    out = qa(input_ids=input_ids, attention_mask=attention_mask,
             start_positions=torch.tensor([3, 4]), end_positions=torch.tensor([5, 200]))
    assert out.start_logits.shape == (2, 100) and torch.isfinite(out.loss)
    out.loss.backward()
    assert qa.qa_start.weight.grad.abs().sum() > 0 and qa.qa_end.dense.weight.grad.abs().sum() > 0
    cls = longbird.LongBirdForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    out = cls(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)


def test_reference_implementation_selected_at_load(tmp_path):
    longbird.convert(make_source("bert"), max_length=128, block_size=BLOCK).save_pretrained(tmp_path)
    model = AutoModel.from_pretrained(tmp_path, attn_implementation="reference")
    assert model.config._attn_implementation == "reference"


@pytest.mark.parametrize("name", ["bert", "roberta-mlm", "electra-mlm"])
def test_export_to_hf_bigbird_loads_cleanly_with_equal_outputs(tmp_path, name):
    source = make_source(name)
    if name == "electra-mlm":
        with pytest.raises(ValueError, match="hf-bigbird has no embedding projection"):
            longbird.export.to_bigbird(longbird.convert(source, max_length=128, block_size=BLOCK))
        return
    model = longbird.convert(source, max_length=128, block_size=BLOCK)
    model.save_pretrained(tmp_path / "lb")
    export(tmp_path / "lb", tmp_path / "hf")
    target_class = BigBirdForMaskedLM if name.endswith("mlm") else BigBirdModel
    hf, info = target_class.from_pretrained(tmp_path / "hf", output_loading_info=True, attention_type="original_full")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf.eval()
    input_ids, attention_mask = make_batch(60, pad_id=model.config.pad_token_id)
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask)
        theirs = hf(input_ids=input_ids, attention_mask=attention_mask)
    real = attention_mask.bool()
    key = "logits" if name.endswith("mlm") else "last_hidden_state"
    assert (ours[key] - theirs[key])[real].abs().max() <= 1e-5
    if key == "last_hidden_state":
        torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=1e-5, rtol=1e-5)
        base, base_info = BigBirdModel.from_pretrained(tmp_path / "hf", output_loading_info=True)
        assert not base_info["missing_keys"] and not base_info["unexpected_keys"]


def test_atomic_write_keeps_old_output_on_failure(tmp_path):
    out = tmp_path / "model"
    write_directory_atomically(out, lambda d: (d / "weights").write_text("old"))

    def crash(directory):
        (directory / "weights").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_directory_atomically(out, crash, overwrite=True)
    assert (out / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial directory left behind
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        write_directory_atomically(out, lambda d: None)


def test_atomic_outputs_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from longbird.files import write_file_atomically

    umask = os.umask(0o022)
    try:
        out = write_directory_atomically(tmp_path / "dir", lambda d: (d / "f").write_text("x"))
        path = write_file_atomically(tmp_path / "report.json", "{}")
        saved = write_directory_atomically(tmp_path / "saved", lambda d: longbird.convert(
            make_source("bert"), max_length=128, block_size=BLOCK).save_pretrained(d))
    finally:
        os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((saved / "model.safetensors").stat().st_mode) == 0o644  # safetensors alone writes 0600
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text() == "{}"


def _exported_pair(tmp_path, random_blocks):
    model = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, num_random_blocks=2,
                             random_blocks=random_blocks)
    model.save_pretrained(tmp_path / "lb")
    export(tmp_path / "lb", tmp_path / "hf")
    return model


# L = 64 and (5 + 2r)·b = 72: below L, between L and transformers' threshold, far above (sparse in both).
@pytest.mark.parametrize("length", [50, 70, 256])
def test_export_with_the_transformers_plan_computes_what_longbird_computes(tmp_path, length):
    model = _exported_pair(tmp_path, "transformers")
    assert model.config.full_attention_threshold == 72
    # A fresh BigBirdModel per length: transformers switches a model to full attention for good after one short input.
    hf = BigBirdModel.from_pretrained(tmp_path / "hf").eval()
    input_ids, _ = make_batch(length, batch=1, padded_rows=0)
    with torch.no_grad():
        ours = model(input_ids=input_ids).last_hidden_state
        theirs = hf(input_ids=input_ids).last_hidden_state
    assert hf.attention_type == ("original_full" if length <= 72 else "block_sparse")
    assert (ours - theirs).abs().max() <= 1e-5


def test_transformers_plan_reference_counts_block_zero_one_plus_r_times():
    """The dense oracle reproduces the blocked kernel's repeated block 0 with a log-count bias."""
    model = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, num_random_blocks=2,
                             random_blocks="transformers")
    reference = longbird.convert(make_source("bert"), max_length=256, block_size=BLOCK, num_random_blocks=2,
                                 random_blocks="transformers", attn_implementation="reference")
    input_ids, attention_mask = make_batch(200)
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        oracle = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    assert (ours - oracle)[real].abs().max() <= 1e-5
    pattern = longbird.attention.bigbird_pattern(10, BLOCK, 4, 2, 0, 0, "transformers")
    assert pattern.repeats_blocks and (pattern.block_counts()[:, 2:-2, 0] == 3).all()


def test_export_of_the_seeded_plan_warns_in_one_line(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="longbird.export"):
        _exported_pair(tmp_path, "seeded")
    (message,) = [record.getMessage() for record in caplog.records if record.name == "longbird.export"]
    assert "random_blocks='seeded'" in message and "random_blocks='transformers'" in message and "\n" not in message
    caplog.clear()
    with caplog.at_level("WARNING", logger="longbird.export"):
        _exported_pair(tmp_path / "t", "transformers")
    assert not [record for record in caplog.records if record.name == "longbird.export"]


def test_attention_maps_are_refused_by_name_not_returned_as_none():
    """`output_attentions=True` returned attentions=None without a word: the kernels never form the attention matrix.
    Every class refuses it; off, nothing changes. (transformers itself refuses `config.output_attentions = True` for
    this model's attention implementation.)"""
    import pytest
    import torch
    from transformers import BertConfig, BertModel

    import longbird
    from longbird.heads import LongBirdForQuestionAnswering, LongBirdForSequenceClassification

    torch.manual_seed(0)
    source = BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64))
    encoder = longbird.convert(source, max_length=128, block_size=8).eval()
    ids = torch.randint(5, 99, (1, 20))
    for model in (encoder, LongBirdForQuestionAnswering(encoder.config), LongBirdForSequenceClassification(
            encoder.config)):
        with pytest.raises(ValueError, match="longbird returns no attention maps"):
            model(input_ids=ids, output_attentions=True)
        model(input_ids=ids, output_attentions=False)


def test_a_replacement_killed_between_its_renames_is_undone_by_the_next_write(tmp_path, caplog, monkeypatch):
    """Replacing an output moves the old one aside, then renames the new one in: a kill between the two left nothing
    at --out. The next write (or check) puts the old copy back; a rename that fails puts it back at once; temporary
    copies left by killed writes are named."""
    import os

    from longbird.files import check_writable

    out = tmp_path / "model"
    write_directory_atomically(out, lambda d: (d / "weights").write_text("old"))
    aside = tmp_path / ".model.old-x1"  # what a kill between the renames leaves
    aside.mkdir()
    os.replace(out, aside / "model")
    (tmp_path / ".model.partial-y2").mkdir()
    check_writable(out)  # a moment ago: another process's replacement may be between its renames, left alone
    assert not out.exists() and aside.is_dir()
    old = time.time() - 120
    os.utime(aside, (old, old))  # minutes ago: a killed replacement's
    with caplog.at_level("WARNING", logger="longbird.files"):
        with pytest.raises(FileExistsError, match="already exists"):
            check_writable(out)
    assert (out / "weights").read_text() == "old" and not aside.exists()
    assert "restored" in caplog.text and ".model.partial-y2, left by an interrupted write" in caplog.text

    real_replace = os.replace

    def failing_second_rename(source, target):
        if str(source).startswith(str(tmp_path / ".model.partial-")) and ".old-" not in str(source):
            raise OSError("disk gone")
        return real_replace(source, target)

    monkeypatch.setattr(os, "replace", failing_second_rename)
    with pytest.raises(OSError, match="disk gone"):
        write_directory_atomically(out, lambda d: (d / "weights").write_text("new"), overwrite=True)
    monkeypatch.undo()
    assert (out / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.partial-y2", "model"]


def test_an_output_that_appears_while_one_is_written_is_kept_without_overwrite(tmp_path):
    """Two processes writing one output (the e5 cache): the later one replaced the copy the first had published, which
    that process may have been loading, although overwrite was False."""
    out = tmp_path / "cache"

    def write(directory):
        (directory / "config.json").write_text("mine")
        write_directory_atomically(out, lambda d: (d / "config.json").write_text("theirs"))  # the other process

    with pytest.raises(FileExistsError, match="appeared while this one was written"):
        write_directory_atomically(out, write)
    assert (out / "config.json").read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
