"""Issue 11 item 7: `import longbird` loads neither torch nor transformers (so `--help` answers at once; timed by
benchmarks/cli_startup.py, not here), the Auto classes still learn model_type "longbird" in any import order, every
`--help` exits 0, and `bench --smoke` picks its quick defaults only where the user chose nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from fresh_process import fresh_processes
from typer.testing import CliRunner

from longbird.cli import app


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_longbird_loads_no_heavy_library():
    out = _python("import sys, longbird; print(longbird.__version__, "
                  "sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    assert out.endswith("[]"), out


def test_python_dash_m_longbird_is_the_command_line():
    done = subprocess.run([sys.executable, "-m", "longbird", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.strip().startswith("longbird ")


def test_cli_help_loads_no_heavy_library():
    out = _python("import sys\nfrom typer.testing import CliRunner\nfrom longbird.cli import app\n"
                  "result = CliRunner().invoke(app, ['convert', '--help'])\n"
                  "print(result.exit_code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    assert out == "0 False False", out


def test_serve_refuses_a_wrong_model_before_loading_torch():
    """A mistyped --model is said in a second: checked before torch (seconds to import) and the model load."""
    out = _python("import socket, sys\nfrom typer.testing import CliRunner\nfrom longbird.cli import app\n"
                  "probe = socket.socket(); probe.bind(('127.0.0.1', 0)); port = probe.getsockname()[1]; "
                  "probe.close()\n"
                  "result = CliRunner().invoke(app, ['serve', '--model', '/no/such/model', '--port', str(port)])\n"
                  "print(result.exit_code, 'torch' in sys.modules, 'not a longbird or transformers model' in "
                  "result.output)")
    assert out == "1 False True", out


def test_serve_refuses_a_bad_api_key_before_loading_torch(tmp_path):
    """An --api-key clients could not send (empty, spaced) is said at once, before the port and the model."""
    (tmp_path / "config.json").write_text("{}")
    out = _python("import sys\nfrom typer.testing import CliRunner\nfrom longbird.cli import app\n"
                  f"result = CliRunner().invoke(app, ['serve', '--model', {str(tmp_path)!r}, '--api-key', 'a b'])\n"
                  "print(result.exit_code, 'torch' in sys.modules, 'printable ASCII without spaces' in result.output)")
    assert out == "1 False True", out


@pytest.fixture(scope="module")
def run_fresh():
    with fresh_processes() as run:
        yield run


@pytest.mark.parametrize("first, then", [
    ("import longbird", "from transformers import AutoConfig"),  # the hook registers after transformers loads
    ("from transformers import AutoConfig", "import longbird"),  # transformers already there: registers at once
    ("from longbird.modeling import LongBirdModel", "from transformers import AutoConfig"),
    ("from longbird.heads import LongBirdForQuestionAnswering", "from transformers import AutoConfig"),
    ("import longbird.data.reading", "from transformers import AutoConfig"),
    ("from longbird.config import LongBirdConfig", "from transformers import AutoConfig"),
    ("from transformers import PreTrainedModel", "from longbird.heads import LongBirdForSpanSelection"),
])
def test_auto_classes_know_longbird_in_any_import_order(first, then, run_fresh):
    """Each order in a process of its own, whose only import before it is torch (tests/fresh_process.py)."""
    out = run_fresh("import sys\nassert not {'transformers', 'longbird'} & set(sys.modules), sorted(sys.modules)\n"
                    f"{first}\n{then}\nfrom transformers import AutoConfig, AutoModelForQuestionAnswering\n"
                    "config = AutoConfig.for_model('longbird', num_hidden_layers=1, hidden_size=32, "
                    "num_attention_heads=2, intermediate_size=64, vocab_size=50, max_position_embeddings=128, "
                    "source_max_positions=64, block_size=16)\n"
                    "print(type(config).__name__, type(AutoModelForQuestionAnswering.from_config(config)).__name__)")
    assert out == "LongBirdConfig LongBirdForQuestionAnswering", out


def test_lazy_public_names():
    import longbird
    import longbird.conversion  # noqa: F401
    from longbird.tasks.qa import answer

    assert callable(longbird.convert) and longbird.convert.__module__ == "longbird.conversion"
    assert longbird.answer is answer and "LongBirdModel" in dir(longbird)
    from longbird.checkpoints import load_tape_peft
    from longbird.training.peft import tape_peft

    assert longbird.tape_peft is tape_peft and longbird.load_tape_peft is load_tape_peft
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        longbird.nothing


COMMANDS = typer.main.get_command(app).commands


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_help_exits_zero_and_explains_every_option(command):
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Usage: " in result.output and "error" not in result.output, result.output
    unexplained = [parameter.name for parameter in COMMANDS[command].params if not getattr(parameter, "help", None)]
    assert not unexplained, f"{command}: no help text for {unexplained}"


def test_bench_smoke_quick_defaults_yield_to_the_users_choice(monkeypatch, tmp_path):
    import longbird.bench.sweep as sweep

    seen = []

    def fake_sweep(settings, progress, checkpoint):
        seen.append((settings.lengths, settings.repeats, settings.sizes))
        return {"rows": []}

    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    monkeypatch.setattr("longbird.bench.report.write_report", lambda report, out, command, stem: [])
    monkeypatch.setattr("longbird.bench.report.markdown", lambda report, command: "")
    runner = CliRunner()
    assert runner.invoke(app, ["bench", "--smoke", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["bench", "--smoke", "--length", "256", "--repeats", "2", "--out", str(tmp_path)]).exit_code == 0
    assert runner.invoke(app, ["bench", "--out", str(tmp_path)]).exit_code == 0
    assert seen[0] == ([512, 1024], 1, ["smoke"])
    assert seen[1] == ([256], 2, ["smoke"])
    assert seen[2][:2] == ([1024, 2048, 4096, 8192, 16384], 3)
