"""`longbird bench` smoke run (2 lengths, tiny model) and the report helpers. Timings are not asserted."""

import json
import math

from typer.testing import CliRunner

from longbird.bench.report import fitted_exponent
from longbird.cli import app


def test_fitted_exponent_recovers_power_laws():
    assert math.isclose(fitted_exponent([(4096, 1.0), (8192, 2.0), (16384, 4.0)]), 1.0)
    assert math.isclose(fitted_exponent([(4096, 1.0), (8192, 4.0)]), 2.0)
    assert fitted_exponent([(1024, 1.0), (2048, 2.0)]) is None  # nothing at or above 4K


def test_bench_smoke_writes_json_markdown_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGBIRD_ROW_PLAN", "op")  # recorded with the command: it changes what a compiled model runs
    monkeypatch.setenv("LONGBIRD_API_KEY", "secret")  # and a secret is not
    result = CliRunner().invoke(app, ["bench", "--smoke", "--length", "128", "--length", "256", "--repeats", "1",
                                      "--model", "littlebird", "--model", "kobigbird", "--model", "sdpa-roberta",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench_smoke.json").read_text())
    assert not (tmp_path / "bench_smoke.partial.json").exists()  # the checkpoint is replaced by the report
    measured = [row for row in report["rows"] if "skipped" not in row]
    assert {(row["model"], row["mode"], row["length"]) for row in measured} == {
        (model, mode, length) for model in ("littlebird", "kobigbird", "sdpa-roberta")
        for mode in ("forward", "forward+backward") for length in (128, 256)}
    assert all(row["median_seconds"] > 0 and row["peak_mib"] > 0 for row in measured)
    assert report["matmul_tflops"]["fp32"] > 0 and report["cpu"] and report["threads"] >= 1
    assert report["device"] == "cpu" and all(row["batch"] == 1 and row["size"] == "smoke" for row in measured)
    # Tokens/s and the linear layers' FLOP rate follow from the median time (one sequence per call).
    for row in measured:
        assert math.isclose(row["tokens_per_second"], row["length"] / row["median_seconds"])
    markdown = (tmp_path / "bench_smoke.md").read_text()
    assert "| littlebird |" in markdown and "Command: `LONGBIRD_ROW_PLAN=op longbird bench" in markdown
    assert "secret" not in markdown and "secret" not in json.dumps(report)
    for mode in ("forward", "forward_backward"):
        assert (tmp_path / f"bench_smoke_smoke_b1_fp32_{mode}.png").stat().st_size > 1000


def test_bench_largest_batch_search_and_gradient_checkpointing(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--smoke", "--length", "128", "--repeats", "1", "--model", "littlebird",
                                      "--batch", "max", "--max-batch", "4", "--mode", "forward+backward",
                                      "--gradient-checkpointing", "--out", str(tmp_path), "--name", "b"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert row["batch"] == 4 and row["batch_setting"] == "max"  # nothing runs out of memory on this CPU
    assert math.isclose(row["tokens_per_second"], 4 * 128 / row["median_seconds"])
    assert "largest batch that fits" in (tmp_path / "b.md").read_text()


def test_bench_refuses_cuda_without_a_gpu_and_bad_settings(tmp_path):
    import torch

    if not torch.cuda.is_available():
        result = CliRunner().invoke(app, ["bench", "--smoke", "--device", "cuda", "--out", str(tmp_path)])
        assert result.exit_code != 0 and "CUDA is not available" in result.output
    result = CliRunner().invoke(app, ["bench", "--smoke", "--batch", "0", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "batch must be a positive number or 'max'" in result.output
    # refused before the progress bar and the first model (a length that is not a block multiple failed at its turn
    # with the library's --max-length spelling; --repeats 0 after the whole sweep; --size with --smoke was ignored)
    for options, message in ((["--model", "kobigbird", "--length", "1000"],
                              "--length 1000 does not fit kobigbird, which reads whole blocks of 64 tokens; use 1024"),
                             (["--repeats", "0"], "--repeats must be at least 1"),
                             (["--model", "nope"], "unknown benchmark model 'nope'"),
                             (["--size", "huge"], "--size does not apply with --smoke")):
        result = CliRunner().invoke(app, ["bench", "--smoke", "--out", str(tmp_path), *options])
        assert result.exit_code in (1, 2) and message in " ".join(result.output.split()), result.output
    assert not list(tmp_path.iterdir())
    earlier = tmp_path / "bench_smoke.json"  # results already in OUT are never replaced without --overwrite
    earlier.write_text("{}")
    result = CliRunner().invoke(app, ["bench", "--smoke", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "bench_smoke.json already exists; pass --overwrite to replace it" in result.output
    assert earlier.read_text() == "{}"
    earlier.unlink()  # nor the points of an interrupted run (the new run's first point wrote over them)
    interrupted = tmp_path / "bench_smoke.partial.json"
    interrupted.write_text("{}")
    result = CliRunner().invoke(app, ["bench", "--smoke", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "bench_smoke.partial.json holds an interrupted run's points: move it to keep " \
        "them" in " ".join(result.output.split()), result.output
    assert interrupted.read_text() == "{}"


def test_a_run_out_of_memory_is_recorded_as_a_skip_not_a_crash():
    import torch

    from longbird.bench.sweep import _measure

    calls = {"fits": 0, "flaky": 0}

    def fits():
        calls["fits"] += 1
        return torch.zeros(1)

    def flaky():  # fits for the warm-up, then runs out of memory (fragmentation near the limit)
        calls["flaky"] += 1
        if calls["flaky"] > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 384.00 MiB")
        return torch.zeros(1)

    rows = _measure({"fits": fits, "flaky": flaky}, repeats=2, device=torch.device("cpu"))
    assert rows["flaky"] == {"skipped": "out of GPU memory while timing"}
    assert rows["fits"]["median_seconds"] >= 0 and calls["fits"] == 4  # warm-up, 2 timed, 1 profiled


def test_a_benchmark_table_is_written_as_json_and_markdown_side_by_side(tmp_path, capsys):
    from longbird.bench.report import write_table

    write_table({"rows": [{"a": 1}]}, ["| a |", "|---|", "| 1 |"], tmp_path, "table")
    assert json.loads((tmp_path / "table.json").read_text()) == {"rows": [{"a": 1}]}
    assert (tmp_path / "table.md").read_text() == "| a |\n|---|\n| 1 |\n"
    assert "| 1 |" in capsys.readouterr().out


def test_bench_times_compiled_presets_beside_eager_and_reports_a_failed_compile(monkeypatch):
    """`--compile MODE` adds "PRESET+compile[:MODE]" rows for longbird presets only, each compiled whole
    (fullgraph, static shapes), with its first call (the compile) apart; a compile that fails is a skip with its
    reason. The compiler is swapped for Dynamo's eager backend (and a failing one): the plumbing, not Inductor."""
    import pytest
    import torch

    from longbird.bench import sweep
    from longbird.bench.report import markdown

    real_compile, options_seen = torch.compile, []

    class FailsToCompile(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, **inputs):
            raise RuntimeError("CppCompileError: C++ compile error\n<pages of generated code>")

    def compile_for_test(model, **options):
        options_seen.append(options)
        if options["mode"] == "reduce-overhead":
            return FailsToCompile(model)
        return real_compile(model, backend="eager", fullgraph=options["fullgraph"], dynamic=options["dynamic"])

    monkeypatch.setattr(torch, "compile", compile_for_test)
    settings = sweep.SweepSettings(models=["littlebird", "sdpa-roberta"], lengths=[128], modes=["forward"],
                                   sizes=["smoke"], repeats=1, compile_modes=["default", "reduce-overhead"])
    report = sweep.run_sweep(settings)
    rows = {row["model"]: row for row in report["rows"]}
    assert set(rows) == {"littlebird", "sdpa-roberta", "littlebird+compile", "littlebird+compile:reduce-overhead"}
    assert options_seen == [dict(fullgraph=True, dynamic=False, mode="default"),
                            dict(fullgraph=True, dynamic=False, mode="reduce-overhead")]
    compiled = rows["littlebird+compile"]
    assert compiled["median_seconds"] > 0 and compiled["first_call_seconds"] > 0 and compiled["length"] == 128
    assert rows["littlebird+compile:reduce-overhead"]["skipped"] == (
        "compile failed: RuntimeError: CppCompileError: C++ compile error")
    text = markdown(report, "longbird bench --compile default")
    assert "| littlebird+compile | " in text and "Compiled against eager" in text
    with pytest.raises(ValueError, match="compile mode must be one of"):
        sweep.SweepSettings(compile_modes=["fast"])


def test_alternating_times_run_the_calls_in_turn_after_one_untimed_call_each():
    from longbird.bench.sweep import alternating_times

    order = []
    times = alternating_times({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3)
    assert order == ["a", "b"] * 4  # one untimed round, then three timed ones
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3}
    assert all(value >= 0 for values in times.values() for value in values)
