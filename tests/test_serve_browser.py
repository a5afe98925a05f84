"""The web page of `longbird serve` in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium) loads a real KorQuAD 2.1 page into the page's document box, types a question, asks, and the
best answer is listed with its probability and highlighted in the rendered document, scrolled into view. Plain text
too. Served by uvicorn on a loopback port.

Chromium comes from the system: `.ci/run` installs it (apt, in the background while the suite starts), so in CI
(CI=true) a missing browser fails; elsewhere these tests are skipped with the command that installs it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import threading
import time

import pytest

from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from longbird.serve import ServeSettings, create_app
from test_qa_cli import PAGES, tiny_qa, tiny_source  # noqa: F401  (fixtures)

INSTALL = "apt-get install --no-install-recommends chromium chromium-driver netbase"


def system_browser() -> tuple[str, str]:
    """(chromium, chromedriver). `.ci/run` installs them in the background while the suite starts
    (LONGBIRD_BROWSER_INSTALL_PID): wait for that install; in CI a missing browser fails, elsewhere it skips."""
    installing = os.environ.get("LONGBIRD_BROWSER_INSTALL_PID")
    deadline = time.time() + 900
    while installing and not (shutil.which("chromium") and shutil.which("chromedriver")) and time.time() < deadline:
        try:
            os.kill(int(installing), 0)
        except OSError:
            break  # the install has ended
        time.sleep(2)
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if not all(found):
        message = f"the browser test needs Debian's chromium and chromium-driver: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message + " (.ci/run installs them)")
        pytest.skip(message)
    return found


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@contextlib.contextmanager
def serving(app):
    """`app` served by uvicorn on a free loopback port: its URL."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not running.started and time.time() < deadline:
        time.sleep(0.05)
    assert running.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        running.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def server(tiny_qa):
    reader = Reader(tiny_qa)
    with serving(create_app(reader)) as url:
        yield url, reader


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = system_browser()
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)  # the system driver: nothing downloaded
    yield driver
    driver.quit()


def ask(browser, url: str, document: str, question: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url + "/")
    browser.execute_script("document.getElementById('document').value = arguments[0];", document)
    browser.find_element(By.ID, "question").send_keys(question)
    browser.find_element(By.ID, "ask").click()
    WebDriverWait(browser, 60).until(expected_conditions.presence_of_element_located((By.ID, "result-0")))
    return browser.find_element(By.ID, "result-0"), browser.find_element(By.ID, "status").text


def test_a_question_over_a_korquad_page_is_answered_and_highlighted(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, reader = server
    row = read_korquad_v2(PAGES[0])[0][0]
    expected = reader.answer(row["question"], row["context"], top_k=3).answers
    result, status = ask(browser, url, row["context"], row["question"])
    assert normalised(result.find_element(By.CLASS_NAME, "answer").text) == normalised(expected[0]["answer"])
    assert re.search(r"\(\d+\.\d %\)", result.text)  # its probability
    assert re.match(r"\d+ window\(s\), \d+ tokens, \d+\.\d\d s", status)
    frame = browser.find_element(By.ID, "page")
    WebDriverWait(browser, 30).until(lambda b: b.execute_script(
        "const d = arguments[0].contentDocument; return d && d.getElementById('answer-0') !== null;", frame))
    browser.switch_to.frame(frame)
    try:
        mark = browser.find_element(By.ID, "answer-0")
        assert "best" in mark.get_attribute("class")
        assert normalised(mark.text) == normalised(expected[0]["answer"])
        visible = browser.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return r.bottom > 0 && r.top < window.innerHeight;", mark)
        assert visible  # scrolled into view
    finally:
        browser.switch_to.default_content()


def test_plain_text_is_highlighted_and_errors_are_shown(server, browser):
    from selenium.webdriver.common.by import By

    url, reader = server
    # characters beyond the BMP before the answer: one code point each for the server, two UTF-16 units for the page
    text = "😀𠀀 " * 3 + "첫 문장이다. " * 200 + "신대철의 아버지는 신중현이다. " + "마지막 문장이다. " * 200
    question = "신대철의 아버지는 누구야?"
    expected = reader.answer(question, text).answers[0]
    ask(browser, url, text, question)
    mark = browser.find_element(By.CSS_SELECTOR, "#text mark.best")
    assert mark.text == expected["answer"] == text[expected["start"]:expected["end"]]
    browser.get(url + "/")
    browser.find_element(By.ID, "question").send_keys("무엇?")
    browser.find_element(By.ID, "ask").click()
    time.sleep(0.5)
    for _ in range(100):
        status = browser.find_element(By.ID, "status")
        if "error" in status.get_attribute("class"):
            break
        time.sleep(0.1)
    assert "document: is empty" in status.text  # the server's 422, shown to the person


def error_shown(browser) -> str:
    from selenium.webdriver.common.by import By

    for _ in range(300):
        status = browser.find_element(By.ID, "status")
        if "error" in status.get_attribute("class"):
            return status.text
        time.sleep(0.1)
    raise AssertionError(f"no error shown; status: {status.text!r}")


def test_a_server_with_an_api_key_asks_for_it_and_answers_once_it_is_given(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    _, reader = server
    text = "첫 문장이다. " * 20 + "신대철의 아버지는 신중현이다. " + "마지막 문장이다. " * 20
    question = "신대철의 아버지는 누구야?"
    expected = reader.answer(question, text).answers[0]
    with serving(create_app(reader, ServeSettings(api_key="s3cret"))) as url:
        browser.get(url + "/")
        assert not browser.find_element(By.ID, "api_key").is_displayed()  # a server without a key never asks
        browser.execute_script("document.getElementById('document').value = arguments[0];", text)
        browser.find_element(By.ID, "question").send_keys(question)
        browser.find_element(By.ID, "ask").click()
        assert "this server needs an API key" in error_shown(browser)
        key = browser.find_element(By.ID, "api_key")
        assert key.is_displayed()
        key.send_keys("wrong")
        browser.find_element(By.ID, "ask").click()
        assert "the API key was not accepted" in error_shown(browser)
        key.clear()
        key.send_keys("s3cret")
        browser.find_element(By.ID, "ask").click()
        WebDriverWait(browser, 60).until(expected_conditions.presence_of_element_located((By.ID, "result-0")))
        assert browser.find_element(By.CSS_SELECTOR, "#text mark.best").text == expected["answer"]
