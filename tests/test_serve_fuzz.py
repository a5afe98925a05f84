"""API-schema fuzzing of `longbird serve` with schemathesis: requests generated from the app's own OpenAPI schema,
valid ones and ones that break it (negative mode), never get a 5xx and are answered with a documented status and a
JSON or text body. In-process (ASGI), a tiny QA model, a bounded number of examples per route. (schemathesis's own
pytest plugin does not run under this pytest, so its strategies are driven with hypothesis directly.)"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

from longbird.reader import Reader  # noqa: E402
from longbird.serve import ServeSettings, create_app  # noqa: E402
from test_qa_cli import tiny_qa, tiny_source  # noqa: E402, F401  (fixtures)


@pytest.fixture(scope="module")
def api_schema(tiny_qa):
    app = create_app(Reader(tiny_qa), ServeSettings(max_document_chars=20_000, max_question_chars=300))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_generated_request_gets_a_server_error(api_schema, mode):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {"POST /answer", "POST /", "POST /predict",
                                                                         "GET /health", "GET /info", "GET /metrics"}
    seen = []
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET":
            continue  # a route without parameters has no invalid request to generate
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def call(case):
            response = case.call()
            seen.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)
            assert response.status_code in (200, 400, 401, 404, 405, 413, 415, 422, 503), response.text
            if response.status_code >= 400:
                assert set(response.json()) == {"error", "detail"}, response.text

        call()
    assert len(seen) >= 20 and (mode == GenerationMode.POSITIVE or any(400 <= s < 500 for s in seen))
