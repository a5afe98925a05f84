"""Which sparse kernel a call runs (dispatch.py): the per-call rule, its logged reason, and fallback."""

import logging

import pytest
import torch

import longbird
from conftest import BLOCK, make_batch, make_source
from longbird import dispatch, flex_failures
from longbird.dispatch import CPU_FLEX_MIN_LENGTH, SparseBackend, choose_backend

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch, tmp_path):
    monkeypatch.setattr(flex_failures, "_in_process", {})
    monkeypatch.setattr(flex_failures, "record_path", lambda: tmp_path / flex_failures.RECORD_NAME)
    monkeypatch.setattr(dispatch, "_last_logged", None)
    monkeypatch.delenv("LONGBIRD_ATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("LONGBIRD_VERBOSE", raising=False)
    # the CPU rules without longbird's fused fp32 kernel (which takes LittleBird from flex where it runs: tested below)
    monkeypatch.setenv("LONGBIRD_CPU_KERNEL", "0")


def test_cpu_rule_follows_autograd_and_length(caplog):
    with caplog.at_level(logging.INFO, logger="longbird.attention"):
        with torch.no_grad():
            assert choose_backend("auto", CPU, CPU_FLEX_MIN_LENGTH, 64, kernel="usw").name == "flex"
            assert choose_backend("auto", CPU, CPU_FLEX_MIN_LENGTH - 64, 64, kernel="usw").name == "blocked"
        training = choose_backend("auto", CPU, 8192, 64, kernel="usw")
    assert training.name == "blocked" and "no backward on CPU" in training.reason
    assert [record.getMessage() for record in caplog.records][0].startswith("sparse attention backend: flex")
    assert len(caplog.records) == 3  # INFO once per change of choice


def test_cpu_half_precision_takes_the_blocked_kernels_and_the_model_passes_autocast_dtype(monkeypatch):
    with torch.no_grad():
        for dtype in (torch.bfloat16, torch.float16):
            chosen = choose_backend("auto", CPU, 8192, 64, dtype=dtype)
            assert chosen.name == "blocked" and "half precision" in chosen.reason
        assert choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="usw").name == "flex"
        assert choose_backend("flex", CPU, 8192, 64, dtype=torch.bfloat16).name == "flex"  # an explicit request wins
    from longbird import modeling

    seen = []
    monkeypatch.setattr(modeling, "choose_backend", lambda *args, **kwargs: seen.append(kwargs["dtype"]) or
                        SparseBackend("blocked", "test"))
    model = longbird.convert(make_source("bert"), preset="kobigbird", max_length=256, block_size=BLOCK).eval()
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    with torch.no_grad():
        model(input_ids=input_ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=input_ids)
    assert seen == [torch.float32, torch.bfloat16]


def test_cpu_inference_runs_bigbird_rows_on_the_blocked_kernels_and_the_model_names_its_kernel(monkeypatch):
    # Measured (benchmarks/results/flex_cpu_fp32_small_rerun.md): BigBird rows on CPU are as fast or faster blocked; only
    # LittleBird's USW kernel still gains from compiled flex in fp32.
    with torch.no_grad():
        chosen = choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="bigbird")
        assert chosen.name == "blocked" and "BigBird rows" in chosen.reason
        assert choose_backend("flex", CPU, 8192, 64, kernel="bigbird").name == "flex"  # an explicit request wins
        with pytest.raises(ValueError, match="kernel must be one of"):
            choose_backend("auto", CPU, 8192, 64, kernel="sliding")
    from longbird import modeling

    seen = []
    monkeypatch.setattr(modeling, "choose_backend", lambda *args, **kwargs: seen.append(kwargs["kernel"]) or
                        SparseBackend("blocked", "test"))
    input_ids, _ = make_batch(200, batch=1, padded_rows=0)
    for preset in ("kobigbird", "littlebird"):
        model = longbird.convert(make_source("bert"), preset=preset, max_length=256, block_size=BLOCK).eval()
        with torch.no_grad():
            model(input_ids=input_ids)
    assert seen[0] == "bigbird" and seen[-1] == "usw" and set(seen) == {"bigbird", "usw"}


def test_cpu_fp32_littlebird_takes_the_fused_kernel_where_it_runs_instead_of_flex(monkeypatch):
    """Where longbird's fused fp32 CPU kernel runs (AVX-512, a compiler), LittleBird's fp32 inference at 4K and
    beyond takes it (the blocked path calls it) instead of compiled flex; blocks that are not a multiple of 32 tokens,
    which the kernel does not read packed, and heads wider than it takes keep flex."""
    from longbird.attention import cpu_kernel

    monkeypatch.setattr(cpu_kernel, "available", lambda dtype=torch.bfloat16: dtype == torch.float32)
    with torch.no_grad():
        chosen = choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="usw")
        assert chosen.name == "blocked" and "fused fp32 kernel" in chosen.reason
        assert choose_backend("auto", CPU, 8192, 48, dtype=torch.float32, kernel="usw").name == "flex"
        assert choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="usw", head_size=64).name == "blocked"
        # heads wider than the kernel's registers take (value width <= 64) keep flex
        assert choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="usw", head_size=96).name == "flex"
        assert choose_backend("flex", CPU, 8192, 64, dtype=torch.float32, kernel="usw").name == "flex"
    assert choose_backend("auto", CPU, 8192, 64, dtype=torch.float32, kernel="usw").name == "blocked"  # training


def test_explicit_requests_and_the_environment_variable(monkeypatch):
    assert choose_backend("blocked", CPU, 8192, 64).name == "blocked"
    with pytest.raises(ValueError, match="attention_backend='flex' cannot run here: CPU with autograd on"):
        choose_backend("flex", CPU, 8192, 64)
    with torch.no_grad():
        forced = choose_backend("flex", CPU, 128, 64)
    assert forced.name == "flex" and forced.strict
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        choose_backend("fast", CPU, 8192, 64)
    monkeypatch.setenv("LONGBIRD_ATTENTION_BACKEND", "blocked")  # overrides the config, e.g. for one run
    with torch.no_grad():  # without the variable this call takes flex (the USW kernel in fp32 from 4K)
        assert choose_backend("auto", CPU, 8192, 64, kernel="usw").name == "blocked"


QUERY = torch.zeros(1, 2, 8, 16)


def test_a_failing_flex_call_falls_back_and_stays_on_the_blocked_kernel(caplog):
    calls = []

    def broken():
        calls.append("flex")
        raise RuntimeError("no C++ compiler\nlong details")

    def blocked():
        calls.append("blocked")
        return torch.zeros(1)

    chosen = SparseBackend("flex", "test")
    with caplog.at_level(logging.WARNING, logger="longbird.attention"):
        chosen.run(broken, blocked, QUERY, "bigbird")
        chosen.run(broken, blocked, QUERY, "bigbird")  # e.g. a checkpoint's recomputation: the same kernel again
    assert calls == ["flex", "blocked", "blocked"]
    assert "RuntimeError: no C++ compiler" in caplog.text and "long details" not in caplog.text
    assert "--verbose shows the error" in caplog.text
    with pytest.raises(RuntimeError, match="no C"):  # an explicit flex request is never silently replaced
        SparseBackend("flex", "test", strict=True).run(broken, blocked, QUERY, "bigbird")


def test_a_failure_is_remembered_for_its_family_only():
    """Another kernel, head dimension or dtype is a different compilation: tried afresh."""
    calls = []

    def broken():
        calls.append("flex")
        raise RuntimeError("InductorError: CppCompileError")

    def working():
        calls.append("flex ok")
        return torch.ones(1)

    chosen = SparseBackend("flex", "test")
    chosen.run(broken, lambda: torch.zeros(1), QUERY, "bigbird")
    assert chosen.run(working, lambda: torch.zeros(1), QUERY, "usw").item() == 1
    assert chosen.run(working, lambda: torch.zeros(1), torch.zeros(1, 2, 8, 32), "bigbird").item() == 1
    assert chosen.run(working, lambda: torch.zeros(1), QUERY.bfloat16(), "bigbird").item() == 1
    assert chosen.run(working, lambda: torch.zeros(1), QUERY, "bigbird").item() == 0  # the failed family
    assert calls == ["flex", "flex ok", "flex ok", "flex ok"]
    key = flex_failures.family("bigbird", QUERY)
    assert f"torch-{torch.__version__}" in key and torch.backends.cpu.get_cpu_capability() in key
    assert "head_dim=16" in key and "float32" in key


def test_verbose_shows_the_compilers_message(caplog, monkeypatch):
    monkeypatch.setenv("LONGBIRD_VERBOSE", "1")

    def broken():
        raise RuntimeError("C++ compile error\nerror: 'cur_kvSplitSize8' was not declared in this scope")

    with caplog.at_level(logging.WARNING, logger="longbird.attention"):
        SparseBackend("flex", "test").run(broken, lambda: torch.zeros(1), QUERY, "bigbird")
    assert "'cur_kvSplitSize8' was not declared" in caplog.text


def test_an_unreadable_or_unwritable_record_keeps_the_memory_in_process(monkeypatch, tmp_path):
    record = tmp_path / "not-a-directory"
    record.write_text("{ not json")
    assert flex_failures.known_failure(flex_failures.family("bigbird", QUERY)) is None  # unreadable: ignored
    monkeypatch.setattr(flex_failures, "record_path", lambda: record / flex_failures.RECORD_NAME)  # cannot be made

    def broken():
        raise RuntimeError("no compiler")

    chosen = SparseBackend("flex", "test")
    chosen.run(broken, lambda: torch.zeros(1), QUERY, "bigbird")
    assert flex_failures.known_failure(flex_failures.family("bigbird", QUERY))["error"] == "RuntimeError: no compiler"


# A whole model in a fresh process per call, as `longbird answer` is: flex made to fail in the first process, never
# attempted in the second (before the record, every process paid the failed compile again).
CHILD = """
import sys, torch
from longbird import dispatch
from longbird import LongBirdConfig, LongBirdModel

calls = []
def flex(*args, **kwargs):
    calls.append(1)
    raise RuntimeError("InductorError: CppCompileError: C++ compile error\\nerror: 'cur_kvSplitSize8' was not declared")
dispatch.usw_flex_attention = flex
dispatch.CPU_FLEX_MIN_LENGTH = 0  # CPU inference of LittleBird at any length picks flex
torch.manual_seed(0)
config = LongBirdConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=256, block_size=8, attention="littlebird",
                        position="bialibi", source_max_positions=32)
model = LongBirdModel(config).eval()
with torch.no_grad():
    out = model(input_ids=torch.randint(5, 50, (1, 128))).last_hidden_state
print("flex calls", len(calls), "sum", float(out.double().sum()))
"""


def test_the_failure_is_remembered_by_the_next_process(tmp_path):
    import os
    import subprocess
    import sys

    from longbird.attention import cpu_kernel

    # a fresh record directory; the kernels already built stay where they are (else each child rebuilds them)
    environment = {**os.environ, "LONGBIRD_CACHE": str(tmp_path / "cache"),
                   "LONGBIRD_KERNEL_CACHE": str(cpu_kernel.cache_dir())}
    runs = [subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=environment, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.split() for run in runs)
    assert first[2] != "0" and second[2] == "0", (first, second)  # the second process never tried flex
    assert first[4] == second[4]  # and computed the same thing on the blocked kernels
    assert "flex_attention failed" in runs[0].stderr and "flex_attention failed" not in runs[1].stderr
    record = tmp_path / "cache" / flex_failures.RECORD_NAME
    assert "cur_kvSplitSize8" in record.read_text()


def test_the_one_line_summary_names_the_compilers_error_not_its_warnings():
    message = ("backend='inductor' raised:\nCppCompileError: C++ compile error\n"
               "x.cpp:10:5: warning: comparison of integer expressions\n"
               "x.cpp:250:26: error: 'transpose_block' is not a member of 'at::vec'\n" + "note: padding\n" * 500)
    failure = flex_failures.describe(RuntimeError(message))
    assert failure["error"] == ("RuntimeError: backend='inductor' raised error: 'transpose_block' is not a member "
                                "of 'at::vec'")
    assert failure["detail"].startswith("CppCompileError: C++ compile error\nx.cpp:250:26: error:")
    assert "comparison of integer" not in failure["detail"]
