"""`longbird serve` through HTTP (FastAPI's TestClient) on a tiny fine-tuned QA model and a real KorQuAD 2.1 page:
the server's answer is the command line's, the pipeline format, health/info/metrics, and every kind of bad input
answered with JSON {"error", "detail"} while the server keeps serving."""

from __future__ import annotations

import itertools
import json
import threading

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from longbird.cli import app as cli
from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from longbird.serve import ServeSettings, create_app
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)

QUESTION = "이 문서의 주제는 무엇인가?"


@pytest.fixture(scope="module")
def page():
    row = read_korquad_v2(PAGES[0])[0][0]
    return row["context"], row["question"]


@pytest.fixture(scope="module")
def reader(tiny_qa):
    return Reader(tiny_qa)


@pytest.fixture(scope="module")
def client(reader):
    return TestClient(create_app(reader, ServeSettings(max_document_chars=400_000, max_question_chars=200)))


def test_the_servers_answer_is_the_command_lines(client, tiny_qa, page, tmp_path):
    document, question = page
    served = client.post("/answer", json={"question": question, "document": document})
    assert served.status_code == 200, served.text
    body = served.json()
    path = tmp_path / "page.html"
    path.write_text(document, encoding="utf-8")
    result = CliRunner().invoke(cli, ["answer", "--model", str(tiny_qa), "--document", str(path), "--question",
                                      question, "--json"])
    expected = json.loads(result.output)
    assert len(body["answers"]) == 1
    got = body["answers"][0]
    for key in ("answer", "source_text", "start", "end"):
        assert got[key] == expected[key], key
    assert got["score"] == pytest.approx(expected["score"], abs=1e-5)
    assert document[got["start"]:got["end"]] == got["source_text"]
    assert body["windows"] > 1 and body["tokens"] > body["window_length"] and body["elapsed_ms"] > 0
    assert body["model"] == str(tiny_qa)


def test_top_k_answers_are_distinct_places_and_best_first(client, page):
    document, question = page
    answers = client.post("/answer", json={"question": question, "document": document, "top_k": 5}).json()["answers"]
    assert len(answers) == 5
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert all(a["end"] <= b["start"] or b["end"] <= a["start"] for a, b in itertools.combinations(answers, 2))
    as_float = client.post("/answer", json={"question": question, "document": document, "top_k": 5.0})
    assert as_float.json()["answers"] == answers  # 5.0, as a client computing it in floating point sends it
    first = client.post("/answer", json={"question": question, "document": document}).json()["answers"][0]
    assert answers[0] == first  # the best of five is the single best


def test_the_pipeline_format_of_transformers_is_served_at_root_and_predict(client, page):
    document, question = page
    request = {"inputs": {"question": question, "context": document}, "parameters": {"top_k": 2}}
    for path in ("/", "/predict"):
        response = client.post(path, json=request)
        assert response.status_code == 200, response.text
        answers = response.json()
        assert len(answers) == 2 and set(answers[0]) == {"answer", "score", "start", "end"}
        assert 0 <= answers[0]["score"] <= 1  # the span's probability in its window
    best = client.post("/answer", json={"question": question, "document": document}).json()["answers"][0]
    assert answers[0]["start"] == best["start"] and answers[0]["end"] == best["end"]
    # errors name the pipeline format's own fields
    empty = client.post("/predict", json={"inputs": {"question": question, "context": " "}})
    assert empty.status_code == 422 and empty.json()["detail"].startswith("inputs.context: is empty")
    stride = client.post("/predict", json={"inputs": {"question": question, "context": document},
                                           "parameters": {"max_seq_len": 64, "doc_stride": 64}})
    assert stride.status_code == 422 and stride.json()["detail"].startswith("parameters.doc_stride: 64 must be")
    short = client.post("/predict", json={"inputs": {"question": question, "context": document},
                                          "parameters": {"max_seq_len": 8}})
    assert short.status_code == 422 and short.json()["detail"].startswith("parameters.max_seq_len: 8-token windows")


def test_handle_impossible_answer_compares_the_scoring_rule_without_the_lexical_prior(client, reader, page,
                                                                                       monkeypatch):
    """An answer the window's "no answer" beat (the rule's null-relative value below 0) is dropped however much the
    lexical prior lifts its score: the prior ranks places, it never outweighs "no answer"."""
    document, question = page
    finish = reader.finish
    shift = {}

    def finish_with_prior(request, windows):
        reading = finish(request, windows)
        for record in reading.answers:  # as if the prior had lifted a span that the null beat by `shift`
            record["lexical_prior"] = record["score"] + shift["by"]
        return reading

    monkeypatch.setattr(reader, "finish", finish_with_prior)
    request = {"inputs": {"question": question, "context": document},
               "parameters": {"handle_impossible_answer": True, "top_k": 3}}
    shift["by"] = 0.5  # the rule alone: -0.5, every score above 0
    assert client.post("/predict", json=request).json() == [{"answer": "", "score": 0.0, "start": 0, "end": 0}]
    shift["by"] = -0.5  # the rule alone: +0.5
    kept = client.post("/predict", json=request).json()
    assert len(kept) == 3 and all(answer["answer"] for answer in kept)


def test_health_info_and_metrics(client, tiny_qa):
    assert client.get("/health").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info["model"] == str(tiny_qa) and info["attention"] == "bigbird" and info["max_length"] == 256
    assert info["limits"]["max_document_chars"] == 400_000 and info["version"]
    client.post("/answer", json={"question": "q", "document": "short text here"})
    client.post("/answer", json={"question": "", "document": "x"})
    text = client.get("/metrics").text
    assert 'longbird_requests_total{code="200",method="POST",route="/answer"}' in text
    assert 'longbird_requests_total{code="422",method="POST",route="/answer"}' in text
    for path in ("/scan-1", "/scan-2", "/.env"):  # made-up paths share one label: /metrics cannot be grown by them
        client.get(path)
    client.request("BREW", "/answer")
    client.get("/static-offline-docs/swagger-ui.css")  # a file of the schema pages: its mount's label
    text = client.get("/metrics").text
    assert 'longbird_requests_total{code="404",method="GET",route="unmatched"} 3.0' in text
    assert 'method="other",route="/answer"' in text and "BREW" not in text
    assert 'longbird_requests_total{code="200",method="GET",route="/static-offline-docs"} 1.0' in text
    assert "scan-" not in text and ".env" not in text
    assert "longbird_windows_total" in text and "longbird_request_seconds_bucket" in text
    assert "longbird_queue_depth 0.0" in text


@pytest.mark.parametrize("request_body, status, names", [
    ({"question": "  ", "document": "text"}, 422, "question: is empty"),
    ({"question": "q", "document": "\n\t "}, 422, "document: is empty"),
    ({"question": "q" * 201, "document": "text"}, 422, "--max-question-chars"),
    ({"question": "q", "document": "x" * 400_001}, 413, "--max-document-chars"),
    ({"question": "q"}, 422, "document: Field required"),
    ({"question": "q", "document": "text", "top_k": 0}, 422, "top_k"),
    ({"question": "q", "document": "text", "windw_length": 64}, 422, "windw_length: Extra inputs"),
    ({"question": "q", "document": "text", "window_length": 9999}, 422, "must lie in 1..256"),
    ({"question": "q", "document": "text", "window_length": 64, "doc_stride": 64}, 422, "doc_stride: 64 must be"),
    ({"question": "q", "document": "text", "format": "pdf"}, 422, "format"),
    ({"question": "q", "document": "text", "top_k": True}, 422, "top_k: Value error, must be a JSON number"),
    ({"question": "q", "document": "text", "window_length": "64"}, 422, "window_length: Value error, must be a JSON"),
    ({"question": "q", "document": "text", "top_k": 2.5}, 422, "top_k: Input should be a valid integer"),
    ({"question": "q", "document": "토큰 " * 20_000, "window_length": 64, "doc_stride": 57}, 413, "--max-request-windows"),
])
def test_bad_requests_are_named_and_the_server_keeps_serving(client, request_body, status, names):
    response = client.post("/answer", json=request_body)
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"} and names in json.dumps(body["detail"])
    assert "Traceback" not in response.text
    assert client.post("/answer", json={"question": "q", "document": "some text"}).status_code == 200


def test_malformed_json_wrong_content_type_and_oversized_bodies(client):
    response = client.post("/answer", content=b'{"question": "q", "document": ', headers={
        "content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"] == "invalid request"
    response = client.post("/answer", content=b"question=q", headers={"content-type": "text/plain"})
    assert response.status_code == 415 and "application/json" in response.json()["detail"]
    response = client.post("/answer", content=b"{}", headers={"content-type": "application/json",
                                                              "content-length": str(10**9)})
    assert response.status_code == 413 and response.json()["error"] == "too large"
    assert client.get("/nowhere").json()["error"] == "Not Found"
    response = client.post("/answer", content=b"\x00\xff\xfe", headers={"content-type": "application/json"})
    assert response.status_code in (400, 422) and set(response.json()) == {"error", "detail"}


def test_an_api_key_guards_every_route_but_health(reader):
    guarded = TestClient(create_app(reader, ServeSettings(api_key="s3cret")))
    request = {"question": "q", "document": "some text"}
    assert guarded.post("/answer", json=request).status_code == 401
    wrong = guarded.post("/answer", json=request, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert guarded.post("/answer", json=request, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert guarded.get("/info").status_code == 401 and guarded.get("/health").status_code == 200
    for path in ("/metrics",):
        assert guarded.get(path).status_code == 401
    for path in ("/predict", "/", "/classify", "/embed"):
        assert guarded.post(path, json={}).status_code == 401, path
    # the page and the schema hold no data and a browser cannot send a key when it opens them; the page asks for it
    page = guarded.get("/")
    assert page.status_code == 200 and 'id="api_key"' in page.text


def test_cors_is_off_unless_an_origin_is_given(reader):
    preflight = {"Origin": "https://search.example", "Access-Control-Request-Method": "POST"}
    closed = TestClient(create_app(reader)).options("/answer", headers=preflight)
    assert "access-control-allow-origin" not in closed.headers
    opened = TestClient(create_app(reader, ServeSettings(cors_origins=["https://search.example"])))
    assert opened.options("/answer", headers=preflight).headers["access-control-allow-origin"] == \
        "https://search.example"


def test_a_full_queue_answers_503_with_retry_after(reader):
    """One request holds the model; with a queue of one the next is refused at once, not queued without bound."""
    release, entered = threading.Event(), threading.Event()
    prepare = reader.prepare

    def slow(*args, **kwargs):
        entered.set()
        release.wait(30)
        return prepare(*args, **kwargs)

    client = TestClient(create_app(reader, ServeSettings(max_queue=1, retry_after_seconds=3)))
    request = {"question": "q", "document": "some text"}
    reader.prepare = slow
    try:
        first = {}
        thread = threading.Thread(target=lambda: first.update(r=client.post("/answer", json=request)))
        thread.start()
        assert entered.wait(30)
        busy = client.post("/answer", json=request)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "3" and busy.json()["error"] == "busy"
        release.set()
        thread.join(60)
        assert first["r"].status_code == 200
    finally:
        release.set()
        del reader.prepare
    assert client.post("/answer", json=request).status_code == 200


def test_an_unexpected_failure_is_a_500_without_traceback(reader):
    client = TestClient(create_app(reader), raise_server_exceptions=False)
    reader.prepare = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kernel exploded at /secret/path"))
    try:
        response = client.post("/answer", json={"question": "q", "document": "text"})
    finally:
        del reader.prepare
    assert response.status_code == 500 and response.json()["error"] == "internal error"
    assert "secret" not in response.text and "Traceback" not in response.text
    assert client.post("/answer", json={"question": "q", "document": "text"}).status_code == 200


def test_the_schema_is_served(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/answer", "/", "/predict", "/health", "/info", "/metrics"} <= set(paths)
    docs = client.get("/docs")
    assert docs.status_code == 200 and "cdn." not in docs.text  # nothing from the internet: works offline
    scripts = [part.split('"')[0] for part in docs.text.split('src="')[1:]]
    assert scripts and all(client.get(script).status_code == 200 for script in scripts)


def test_concurrent_requests_are_batched_and_answered_as_if_alone(reader, page):
    """Sixteen concurrent requests of mixed lengths, settings and formats through one server: their windows share
    model passes (the batcher served several requests in one pass), and every answer equals the unbatched one."""
    from concurrent.futures import ThreadPoolExecutor

    document, question = page
    requests = []
    for i in range(16):
        text = document[: 2_000 + 9_000 * (i % 4)]
        requests.append({"question": question if i % 3 else "무엇인가?", "document": text, "top_k": 1 + i % 3,
                         "window_length": (None, 128, 256)[i % 3]})
    app = create_app(reader, ServeSettings(max_batch_tokens=2_048))
    client = TestClient(app)
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda body: client.post("/answer", json=body), requests))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert app.state.batcher.stats["most_requests_in_a_pass"] > 1
    for body, response in zip(requests, responses):
        alone = reader.answer(body["question"], body["document"], top_k=body["top_k"],
                              window_length=body["window_length"])
        got = response.json()["answers"]
        assert [(a["start"], a["end"], a["answer"]) for a in got] == [
            (a["start"], a["end"], a["answer"]) for a in alone.answers]
        for served, expected in zip(got, alone.answers):  # the same function of the same rows; padding may round
            assert served["score"] == pytest.approx(expected["score"], abs=1e-4)


def test_the_batch_plan_respects_the_token_budget():
    from longbird.data.batching import plan_batches

    lengths = [100, 512, 30, 512, 200, 90, 700]
    batches = plan_batches(lengths, max_tokens=1_024, min_fill=0)
    assert sorted(i for batch in batches for i in batch) == list(range(7))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 1_024
    assert [6] in batches  # longer than half the budget with nothing as long beside it: alone


def test_the_servers_default_pass_is_the_readers():
    """settings.py states the reader's pass size without importing it (reader imports torch): kept equal."""
    import longbird.reader

    assert ServeSettings().max_batch_tokens == longbird.reader.FORWARD_TOKENS


def test_the_server_answers_again_after_its_lifespan_ended_and_began(reader):
    """A test client used as a context manager runs the app's startup and shutdown; a later request must still be
    read (a worker that stopped at shutdown would leave it waiting for ever)."""
    app = create_app(reader)
    request = {"question": "q", "document": "some text"}
    with TestClient(app) as first:
        assert first.post("/answer", json=request).status_code == 200
    assert not app.state.batcher.thread.is_alive()  # stopped at shutdown
    with TestClient(app) as second:
        assert second.post("/answer", json=request).status_code == 200
    assert TestClient(app).post("/answer", json=request).status_code == 200


@pytest.fixture(scope="module")
def tiny_classifier(tiny_source, tmp_path_factory):
    from test_qa_cli import _law_and_bill_documents

    folder = tmp_path_factory.mktemp("cls")
    data = _law_and_bill_documents(folder / "docs.jsonl")
    result = CliRunner().invoke(cli, ["finetune-cls", "--model", str(tiny_source), "--max-length", "256", "--train",
                                      str(data), "--out", str(folder / "model"), "--max-steps", "2"])
    assert result.exit_code == 0, result.output
    return folder / "model", [json.loads(line)["text"] for line in data.read_text().splitlines()]


def test_classify_gives_the_probabilities_evaluate_scores_with(tiny_classifier, reader, monkeypatch):
    import torch

    from longbird.reader import document_windows, predict_documents

    model_dir, texts = tiny_classifier
    classifier = Reader(model_dir)
    client = TestClient(create_app(classifier))
    long_text = " ".join(texts) * 2  # several 256-token windows
    body = client.post("/classify", json={"document": long_text, "stride": 32}).json()
    logits = predict_documents(classifier.model, classifier.tokenizer, [long_text], 256, stride=32)[0]
    expected = dict(zip(["bill", "law"], torch.softmax(logits, -1).tolist()))
    assert body["windows"] > 1 and [item["label"] for item in body["labels"]] == sorted(
        expected, key=lambda label: -expected[label])
    for item in body["labels"]:
        assert item["probability"] == pytest.approx(expected[item["label"]], abs=1e-6)
    import longbird.reader

    monkeypatch.setattr(longbird.reader, "FORWARD_TOKENS", 300)  # one window per forward: the same probabilities
    batched = client.post("/classify", json={"document": long_text, "stride": 32}).json()
    assert [(i["label"], pytest.approx(i["probability"], abs=1e-6)) for i in batched["labels"]] == [
        (i["label"], i["probability"]) for i in body["labels"]]
    monkeypatch.undo()
    capped = TestClient(create_app(classifier, ServeSettings(max_request_windows=body["windows"] - 1)))
    refused = capped.post("/classify", json={"document": long_text, "stride": 32})
    assert refused.status_code == 413 and "--max-request-windows" in refused.json()["detail"]
    assert capped.post("/classify", json={"document": long_text, "stride": 0}).status_code == 200  # fewer windows
    windows = document_windows(classifier.tokenizer, long_text, 256, 32)
    assert body["windows"] == len(windows) and body["tokens"] == sum(len(w["input_ids"]) for w in windows)
    read, classify = [], classifier.classify
    classifier.classify = lambda *args, **kwargs: read.append(classify(*args, **kwargs)) or read[-1]
    records = classifier.warm_up()  # the tokens each warm-up document was read with, not the length aimed at
    assert [(r["windows"], r["tokens"]) for r in records] == [(c["windows"], c["tokens"]) for c in read]
    assert [r["windows"] for r in records][:2] == [1, 1] and records[3]["windows"] > records[2]["windows"] > 1
    refused = client.post("/answer", json={"question": "q", "document": "text"})
    assert refused.status_code == 422 and "classification model" in refused.json()["detail"]
    qa = TestClient(create_app(reader)).post("/classify", json={"document": "text"})
    assert qa.status_code == 422 and "needs a fine-tuned classification model" in qa.json()["detail"]


def test_embed_pools_the_encoders_last_states(reader):
    import torch

    client = TestClient(create_app(reader))
    text = "신대철의 아버지는 신중현이다."
    encoded = reader.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        states = reader.model.longbird(**encoded).last_hidden_state[0]
    mean = client.post("/embed", json={"inputs": text}).json()
    assert mean["dimension"] == states.shape[-1] and mean["tokens"] == states.shape[0]
    torch.testing.assert_close(torch.tensor(mean["embeddings"][0]), states.mean(0), atol=1e-5, rtol=1e-5)
    cls = client.post("/embed", json={"inputs": [text, "둘째 문장"], "pooling": "cls", "normalize": True}).json()
    assert len(cls["embeddings"]) == 2
    torch.testing.assert_close(torch.tensor(cls["embeddings"][0]),
                               torch.nn.functional.normalize(states[0], dim=-1), atol=1e-5, rtol=1e-5)
    empty = client.post("/embed", json={"inputs": ["text", " "]})
    assert empty.status_code == 422 and "inputs.1: is empty" in empty.json()["detail"]
    # the texts' windows together: three 2-window texts pass a limit of 6 and not of 5
    two_windows = "신대철의 아버지는 신중현이다. " * 3
    assert len(reader.embed([two_windows], window_length=16)["embeddings"]) == 1
    windows = reader.embed([two_windows], window_length=16, window_limit=100)
    assert windows == reader.embed([two_windows], window_length=16)
    from longbird.data.classification import document_windows

    per_text = len(document_windows(reader.tokenizer, two_windows, 16, 4))
    assert per_text >= 2
    texts = {"inputs": [two_windows] * 3, "window_length": 16}
    within = TestClient(create_app(reader, ServeSettings(max_request_windows=3 * per_text))).post("/embed", json=texts)
    assert within.status_code == 200
    over = TestClient(create_app(reader, ServeSettings(max_request_windows=3 * per_text - 1))).post("/embed",
                                                                                                    json=texts)
    assert over.status_code == 413 and "--max-request-windows" in over.json()["detail"]
    # the shortest window the error names is the shortest that is read (it named one token more)
    special = reader.tokenizer.num_special_tokens_to_add(pair=False)
    refused = client.post("/embed", json={"inputs": ["text"], "window_length": special})
    assert refused.status_code == 422 and f"windows of at least {special + 1} tokens" in refused.json()["detail"]
    assert client.post("/embed", json={"inputs": ["text"], "window_length": special + 1}).status_code == 200


def test_a_server_wide_window_is_the_default_of_requests_that_name_none(tiny_qa):
    reader = Reader(tiny_qa, window_length=64)
    client = TestClient(create_app(reader))
    body = client.post("/answer", json={"question": "q", "document": "some text " * 200}).json()
    assert body["window_length"] == 64 and reader.info()["window_length"] == 64
    assert client.post("/answer", json={"question": "q", "document": "some text", "window_length": 128}).json()[
        "window_length"] == 128
    with pytest.raises(ValueError, match="must lie in 1..256"):
        Reader(tiny_qa, window_length=1024)


def test_warm_up_reads_a_short_a_full_and_two_many_window_documents(reader):
    """`Reader.warm_up` reads the shapes requests bring (dense, a full sparse window, batches of several windows) and
    answers nothing a client sees; the tiny reader is eager, so this checks the documents, not compilation."""
    records = reader.warm_up()
    window = reader.windows_for()[0]
    assert [r["windows"] for r in records][:2] == [1, 1] and 2 <= records[2]["windows"] < records[3]["windows"], records
    assert records[0]["tokens"] < window // 4 and records[1]["tokens"] > window * 3 // 4, (records, window)
    assert all(r["seconds"] >= 0 for r in records)
    assert not reader.compiled


def test_a_server_with_a_compiled_model_warms_up_before_its_first_request(tiny_qa, monkeypatch, page):
    """With `--compile` the startup runs `Reader.warm_up` (before the worker thread starts, so nothing else uses the
    model); an eager server does not. The compilation itself is not run here (minutes on the CPU): warm_up is
    recorded, and the model marked compiled as `nn.Module.compile` marks it."""
    calls = []
    monkeypatch.setattr(Reader, "warm_up", lambda self: calls.append(self) or [])
    eager = Reader(tiny_qa)
    with TestClient(create_app(eager)) as client:
        assert client.get("/health").status_code == 200
    assert calls == []
    compiled = Reader(tiny_qa)
    compiled.model.base_model.compile()  # lazy: nothing compiles until a forward, and the warm-up is recorded
    assert compiled.compiled
    with TestClient(create_app(compiled)) as client:
        assert calls == [compiled]
        context, question = page
        assert client.post("/answer", json={"question": question, "document": context[:2000]}).status_code == 200


def test_one_requests_failure_in_a_shared_pass_fails_only_that_request(reader, monkeypatch):
    """Requests read in one model pass: a request whose decoding raises gets the error, the others their answers
    (each is read again alone), as they would have been answered alone."""
    from longbird.serve import batching

    batcher = batching.WindowBatcher(reader)
    requests = [reader.prepare("q", "some text " * 40, top_k=k) for k in (1, 7, 2)]
    decode = batching.decode_outputs
    monkeypatch.setattr(batching, "decode_outputs", lambda model, feature, output, top_k, max_tokens: (
        (_ for _ in ()).throw(RuntimeError("poisoned")) if top_k == max(7, reader.model.config.qa_top_k) + 100
        else decode(model, feature, output, top_k, max_tokens)))
    requests[1].decode_top_k = max(7, reader.model.config.qa_top_k) + 100  # the poisoned one
    jobs = [batching._Job(request, windows=[None] * len(request.features)) for request in requests]
    for job in jobs:  # queued before the worker starts: one pass takes all three
        batcher.jobs.put(job)
    batcher.start()
    for job in jobs:
        assert job.done.wait(60)
    batcher.close()
    assert isinstance(jobs[1].error, RuntimeError) and jobs[0].error is None and jobs[2].error is None
    for job, request in ((jobs[0], requests[0]), (jobs[2], requests[2])):
        alone = reader.answer("q", "some text " * 40, top_k=request.top_k).answers
        assert [answer_record["start"] for answer_record in reader.finish(request, job.windows).answers] == [
            answer["start"] for answer in alone]


def test_a_huge_max_answer_tokens_is_read_as_the_window(client, reader):
    huge = client.post("/answer", json={"question": "q", "document": "some text " * 40,
                                        "max_answer_tokens": 2**70, "window_length": 64})
    window = client.post("/answer", json={"question": "q", "document": "some text " * 40,
                                          "max_answer_tokens": 64, "window_length": 64})
    assert huge.status_code == 200, huge.text
    assert huge.json()["answers"] == window.json()["answers"]
    pipeline = client.post("/predict", json={"inputs": {"question": "q", "context": "some text"},
                                             "parameters": {"max_answer_len": 2**70}})
    assert pipeline.status_code == 200, pipeline.text


def test_a_500_is_counted_and_the_connection_stays_usable(reader):
    """A route's unexpected exception is answered as JSON by the guard (not re-raised to uvicorn, which dropped the
    keep-alive connection and left the 500 out of /metrics), with CORS headers for an allowed origin."""
    client = TestClient(create_app(reader, ServeSettings(cors_origins=["https://search.example"])),
                        raise_server_exceptions=True)  # a re-raised exception would fail this test
    origin = {"Origin": "https://search.example"}
    reader.finish = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom"))
    try:
        failed = client.post("/answer", json={"question": "q", "document": "text"}, headers=origin)
    finally:
        del reader.finish
    assert failed.status_code == 500 and failed.json()["error"] == "internal error"
    assert failed.headers["access-control-allow-origin"] == "https://search.example"
    text = client.get("/metrics").text
    assert 'longbird_requests_total{code="500",method="POST",route="/answer"} 1.0' in text
    assert 'longbird_request_seconds_count{method="POST",route="/answer"} 1.0' in text
    for status, refused in ((415, client.post("/answer", content=b"q", headers={**origin, "content-type": "text/plain"})),
                            (413, client.post("/answer", content=b"{}", headers={
                                **origin, "content-type": "application/json", "content-length": str(10**9)}))):
        assert refused.status_code == status
        assert refused.headers["access-control-allow-origin"] == "https://search.example"
    text = client.get("/metrics").text
    assert 'longbird_request_seconds_count{method="POST",route="/answer"} 3.0' in text


def test_a_streamed_body_is_refused_once_it_passes_the_limit(reader):
    """A chunked body (no Content-Length) is read only until it passes the limit, then refused without reaching the
    route; one under the limit reaches the route whole."""
    import asyncio

    from longbird.serve.app import Metrics
    from longbird.serve.guard import Guard

    settings = ServeSettings(max_document_chars=1_000, max_question_chars=100)
    chunk, reached = 10_000, []

    async def route(scope, receive, send):
        reached.append((await receive())["body"])

    def stream(chunks: int):
        consumed, sent = [], []

        async def receive():
            consumed.append(1)
            return {"type": "http.request", "body": b" " * chunk, "more_body": len(consumed) < chunks}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/answer",
                 "headers": [(b"content-type", b"application/json")]}
        asyncio.run(Guard(route, settings, Metrics(), lambda scope: ("/answer", "POST"))(scope, receive, send))
        return len(consumed), sent

    consumed, sent = stream(10_000)  # 100 MB offered
    assert sent[0]["status"] == 413 and b"passed" in sent[1]["body"] and not reached
    assert consumed == settings.max_body_bytes // chunk + 1  # read up to the limit, not to the end
    consumed, sent = stream(2)
    assert consumed == 2 and reached == [b" " * 2 * chunk]


def test_a_document_within_the_character_limit_passes_whatever_its_escaping(reader):
    """The body limit allows 16 bytes a character: a document of emoji escaped as surrogate pairs (12 bytes each) is
    within --max-document-chars and is not refused for its size in bytes (it was, at 6 bytes a character)."""
    settings = ServeSettings(max_document_chars=20_000, max_question_chars=100)
    client = TestClient(create_app(reader, settings))
    body = json.dumps({"question": "q", "document": "😀" * 19_000}).encode()  # one word: one unknown token
    assert len(body) > 6 * 20_100 + 65_536  # over the old limit
    response = client.post("/answer", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def test_texts_the_tokenizer_cannot_read_are_named_not_crashed_on(client):
    for body, field in (('{"question": "\\ud800 q", "document": "some text"}', "question"),
                        ('{"question": "q", "document": "some \\udfff text"}', "document")):
        response = client.post("/answer", content=body.encode(), headers={"content-type": "application/json"})
        assert response.status_code == 422 and f"{field}: holds a lone surrogate" in response.json()["detail"]
    response = client.post("/embed", content=b'{"inputs": ["ok", "\\ud800"]}',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and "inputs.1: holds a lone surrogate" in response.json()["detail"]
    for nothing in ("\u200b\u200b\ufeff", "\x00\x01\x02", "\u3164\u3164 \u115f"):  # format, control, fillers
        invisible = client.post("/answer", json={"question": "q", "document": nothing})
        assert invisible.status_code == 422 and "document: is empty" in invisible.json()["detail"], nothing


def test_api_keys_are_compared_as_bytes_and_unusable_keys_refused(reader):
    for key in ("", "clé", "two words"):
        with pytest.raises(ValueError, match="printable ASCII"):
            ServeSettings(api_key=key)
    guarded = TestClient(create_app(reader, ServeSettings(api_key="s3cret")))
    request = {"question": "q", "document": "some text"}
    foreign = guarded.post("/answer", json=request, headers={"Authorization": "Bearer s3cré".encode()})
    assert foreign.status_code == 401
    assert guarded.post("/answer", json=request, headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_what_clients_probe_and_read_about_the_server(client, reader):
    assert client.head("/health").status_code == 200 and client.head("/").status_code == 200
    info = client.get("/info").json()
    assert info["task"] == "qa" and info["labels"] is None
    broken = client.post("/answer", content=b'{"question": ', headers={"content-type": "application/json"})
    assert "the body is not valid JSON (at character 13" in broken.json()["detail"][0]
    wide = client.post("/predict", json={"inputs": {"question": "q", "context": "text"},
                                         "parameters": {"max_seq_len": 5000}})
    assert wide.status_code == 422 and wide.json()["detail"].startswith("parameters.max_seq_len: ")
    for body in ({"inputs": "a", "normalize": "true"}, {"inputs": "a", "normalize": 1}):
        assert client.post("/embed", json=body).status_code == 422
    flag = client.post("/predict", json={"inputs": {"question": "q", "context": "text"},
                                         "parameters": {"handle_impossible_answer": "yes"}})
    assert flag.status_code == 422
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    bounds = [option for option in schema["AnswerRequest"]["properties"]["max_answer_tokens"]["anyOf"]
              if option.get("type") == "integer"]
    assert bounds == [{"type": "integer", "minimum": 1}]
    before = counter(client.get("/metrics").text, "longbird_windows_total")
    texts = client.post("/embed", json={"inputs": ["one text", "another text"]}).json()
    assert texts["windows"] == 2 == counter(client.get("/metrics").text, "longbird_windows_total") - before


def counter(metrics: str, name: str) -> float:
    import re

    return float(re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE).group(1))


def test_a_classifier_says_what_it_serves_and_where_to_go(tiny_classifier):
    model_dir, _ = tiny_classifier
    client = TestClient(create_app(Reader(model_dir)))
    info = client.get("/info").json()
    assert info["task"] == "classification" and info["labels"] == ["bill", "law"]
    assert info["qa_head"] is None and info["scoring"] is None  # a QA model's settings only
    client.post("/classify", json={"document": "법률안 제1조"})
    assert counter(client.get("/metrics").text, "longbird_tokens_total") > 0
    encoder = TestClient(create_app(Reader.of(Reader(model_dir).model.longbird, Reader(model_dir).tokenizer)))
    refused = encoder.post("/answer", json={"question": "q", "document": "text"}).json()["detail"]
    assert "use /embed" in refused and "/classify" not in refused


def test_a_reader_never_cuts_a_decomposed_syllable(reader):
    import unicodedata

    from longbird.data.features import whole_characters

    document = unicodedata.normalize("NFD", "임종석이 지명수배 된 날은 1989년 2월 15일이다. " * 6)
    answers = reader.answer("임종석이 지명수배 된 날은?", document, top_k=10).answers
    assert len(answers) == 10
    for answer in answers:  # each span already whole characters: widening it changes nothing
        assert whole_characters(document, answer["start"], answer["end"]) == (answer["start"], answer["end"]), answer


def test_a_second_ctrl_c_drops_the_queued_requests_with_503(reader, monkeypatch):
    """`WindowBatcher.cancel` (the second Ctrl-C): the requests still queued are answered 503 at once instead of
    being read first; the worker stops."""
    from longbird.serve import batching
    from longbird.serve.batching import ShuttingDown, WindowBatcher

    batcher = WindowBatcher(reader)
    queued = [batching._Job(reader.prepare("q", "some text"), windows=[None]), batching._Job(None, call=lambda: 1)]
    for job in queued:
        batcher.jobs.put(job)
    being_read, finished = (batching._Job(reader.prepare("q", "text"), windows=[None]) for _ in range(2))
    finished.done.set()
    batcher.reading = [being_read, finished]
    batcher.cancel()
    assert all(job.done.is_set() and isinstance(job.error, ShuttingDown) for job in [*queued, being_read])
    assert finished.error is None  # an answered request keeps its answer
    with pytest.raises(ShuttingDown):  # a request windowed after the signal is refused, no worker started again
        batcher.read(reader.prepare("q", "late text"))
    assert batcher.thread is None

    # a call running alone (every /classify and /embed) when the signal comes is answered too
    started, release = threading.Event(), threading.Event()
    running = WindowBatcher(reader)
    result = {}

    def blocking():
        started.set()
        release.wait(30)
        return "late"

    def call():
        try:
            result["value"] = running.call(blocking)
        except ShuttingDown as error:
            result["error"] = error

    caller = threading.Thread(target=call)
    caller.start()
    assert started.wait(30)
    running.cancel()
    caller.join(10)
    release.set()
    assert isinstance(result.get("error"), ShuttingDown) and "value" not in result

    app = create_app(reader)
    monkeypatch.setattr(app.state.batcher, "read", lambda request: (_ for _ in ()).throw(ShuttingDown("stopping")))
    response = TestClient(app).post("/answer", json={"question": "q", "document": "text"})
    assert response.status_code == 503 and response.json()["error"] == "shutting down" and "retry-after" in \
        response.headers


def test_the_command_lines_second_ctrl_c_cancels_the_queue():
    from longbird.cli.serve import _server

    cancelled = []

    class Batcher:
        def cancel(self):
            cancelled.append(True)

    import signal

    import uvicorn

    server = _server(uvicorn, Batcher())(uvicorn.Config(lambda scope, receive, send: None))
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not server.force_exit and not cancelled  # SIGTERMs stay graceful: the queue read
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit and cancelled == [True]  # Ctrl-C after a stop began: uvicorn's force quit
