"""The chat page at /, driven in headless Chromium: a conversation streamed through the API."""

from __future__ import annotations

import os
import shutil

import pytest

from .conftest import API_KEY, get

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def test_the_page_is_served_without_outside_resources(server):
    status, html = get(server, "/")
    assert status == 200 and "<title>kern chat</title>" in html
    assert "http://" not in html and "https://" not in html  # no CDN: it works offline


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable (Debian: apt-get install chromium)")
def test_a_conversation_in_headless_chromium(server, model_name, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        page.goto(server.url + "/")
        page.fill("#api_key", API_KEY)
        page.dispatch_event("#api_key", "change")
        page.wait_for_function("document.getElementById('model').textContent.includes('context')")
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "12")
        page.fill("#system", "w7 w8 w9")
        for turn, text in enumerate(("w10 w11 w12", "w13 w14")):
            page.fill("#input", text)
            page.press("#input", "Enter")
            page.wait_for_function(f"document.querySelectorAll('.stats').length === {turn + 1} && "
                                   "document.querySelectorAll('.stats')[" + str(turn) + "].textContent.length > 0",
                                   timeout=30000)
        replies = page.locator(".msg.assistant").all_inner_texts()
        stats = page.locator(".stats").all_inner_texts()
        page.screenshot(path=str(os.environ.get("KERN_PAGE_SHOT", tmp_path / "page.png")))
        browser.close()
    assert len(replies) == 2 and all(r.strip() for r in replies)
    assert all("tokens/s" in s and "12 tokens" in s for s in stats), stats
    assert "cached" in stats[1] and "(cached 0)" not in stats[1]  # the second turn reuses the first's prefix
