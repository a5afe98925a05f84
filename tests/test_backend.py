"""Which sparse kernel a call runs (attention/backend.py): the per-call rule, its logged reason, and fallback."""

import logging

import pytest
import torch

from longbird.attention import backend
from longbird.attention.backend import CPU_FLEX_MIN_LENGTH, SparseBackend, choose_backend

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(backend, "_broken", {})
    monkeypatch.setattr(backend, "_last_logged", None)
    monkeypatch.delenv("LONGBIRD_ATTENTION_BACKEND", raising=False)


def test_cpu_rule_follows_autograd_and_length(caplog):
    with caplog.at_level(logging.INFO, logger="longbird.attention"):
        with torch.no_grad():
            assert choose_backend("auto", CPU, CPU_FLEX_MIN_LENGTH, 64).name == "flex"
            assert choose_backend("auto", CPU, CPU_FLEX_MIN_LENGTH - 64, 64).name == "blocked"
        training = choose_backend("auto", CPU, 8192, 64)
    assert training.name == "blocked" and "no backward on CPU" in training.reason
    assert [record.getMessage() for record in caplog.records][0].startswith("sparse attention backend: flex")
    assert len(caplog.records) == 3  # INFO once per change of choice


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
    with torch.no_grad():
        assert choose_backend("auto", CPU, 8192, 64).name == "blocked"


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
        chosen.run(broken, blocked, CPU)
        chosen.run(broken, blocked, CPU)  # e.g. a checkpoint's recomputation: the same kernel as the forward
    assert calls == ["flex", "blocked", "blocked"]
    assert "RuntimeError: no C++ compiler" in caplog.text
    with torch.no_grad():
        assert choose_backend("auto", CPU, 8192, 64).name == "blocked"
    with pytest.raises(RuntimeError, match="no C"):  # an explicit flex request is never silently replaced
        backend._broken.clear()
        SparseBackend("flex", "test", strict=True).run(broken, blocked, CPU)
