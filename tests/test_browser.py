"""The token-credit page in a real headless Chromium (Debian ``chromium`` + ``chromium-driver``, Selenium)."""

from __future__ import annotations

import os

import pytest

from helpers import require
from oar.viz.html import write_html
from oar.viz.style import token_rgb, weight_range
from test_viz import make_record

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@pytest.fixture
def browser(tmp_path):
    require("selenium", "the browser test drives Chromium with Selenium (pip install selenium)")
    missing = [p for p in (CHROMIUM, DRIVER) if not os.access(p, os.X_OK)]
    if missing:
        why = f"{missing} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(f"CI must install Chromium: {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.browser
def test_page_in_headless_chromium(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    a = make_record("oar-g")
    b = make_record("entropy", scores=[0.8, 0.1, 0.3, 0.2, 0.9, 0.5, 0.4, 0.7, 0, 0, 0])
    records = [a, b, make_record("oar-g", prompt="second", step=6)]
    path = write_html(tmp_path / "page.html", records)
    browser.get(path.as_uri())

    spans = browser.find_elements(By.CSS_SELECTOR, "span.tok")
    assert len(spans) == sum(len(r.tokens) for r in records)  # one span per token
    scale = weight_range(records)
    blocks = browser.find_elements(By.CSS_SELECTOR, "div.tokens")
    for block, rec in zip(blocks, records, strict=True):
        assert block.get_attribute("textContent") == rec.text  # whitespace and escapes survive
        shown = browser.execute_script(
            "return Array.from(arguments[0].querySelectorAll('span.tok'), s => getComputedStyle(s).backgroundColor)",
            block,
        )
        want = ["rgb({}, {}, {})".format(*token_rgb(w, r, q, scale))
                for w, r, q in zip(rec.weights, rec.reasoning, rec.answer, strict=True)]
        assert shown == want  # every token coloured by its own weight
    title = spans[3].get_attribute("title")
    assert f"score {a.scores[3]:.4g}" in title and f"weight {a.weights[3]:.3f}" in title

    # hovering a token outlines the same token under the other credit (the inline script runs)
    ActionChains(browser).move_to_element(spans[0]).perform()
    lit = browser.find_elements(By.CSS_SELECTOR, "#ex1 span.tok.hl")
    assert [s.get_attribute("data-i") for s in lit] == ["0", "0"]

    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0  # no fetches
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []
