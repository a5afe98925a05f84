"""The screenshot of `longbird serve`'s web page in the README: headless Chromium (Debian's chromium and
chromium-driver, through Selenium) asks a KorQuAD 2.1 page's question on the served model and saves the page.
Usage: python docs/images/serve_page.py --model DIR [--window-length 512]  ->  docs/images/serve_page.png"""

from __future__ import annotations

import argparse
import shutil
import socket
import threading
import time
from pathlib import Path

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from longbird.data.korquad import read_korquad_v2
from longbird.reader import Reader
from longbird.serve import create_app

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--window-length", type=int, default=None)
    args = parser.parse_args()
    reader = Reader(args.model, window_length=args.window_length)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(reader), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    options = Options()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        row = read_korquad_v2(ROOT / "data" / "korquad" / "korquad2.1_dev_00.json")[0][0]
        browser.get(f"http://127.0.0.1:{port}/")
        browser.execute_script("document.getElementById('document').value = arguments[0];", row["context"])
        browser.find_element(By.ID, "question").send_keys(row["question"])
        browser.find_element(By.ID, "ask").click()
        WebDriverWait(browser, 600).until(expected_conditions.presence_of_element_located((By.ID, "result-0")))
        time.sleep(2)  # the frame renders and scrolls
        browser.save_screenshot(str(Path(__file__).with_name("serve_page.png")))
    finally:
        browser.quit()
        server.should_exit = True


if __name__ == "__main__":
    main()
