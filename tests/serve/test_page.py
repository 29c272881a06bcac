"""The chat page at /, driven in headless Chromium: a conversation streamed through the API."""

from __future__ import annotations

import json
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


def _sent(page) -> list[dict]:
    """The bodies the page POSTs to the chat route, recorded as it sends them."""
    bodies = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.method == "POST" and
            r.url.endswith("/v1/chat/completions") else None)
    return bodies


def _turn(page, text: str, turn: int) -> None:
    """Type a message, press Enter, wait until the turn has ended (stats or an error shown)."""
    page.fill("#input", text)
    page.press("#input", "Enter")
    page.wait_for_function(f"document.querySelectorAll('.msg').length === {2 * (turn + 1)} && "
                           "!document.getElementById('send').disabled", timeout=30000)


@pytest.fixture
def chat_page(server):
    """The chat page in headless Chromium, connected with the API key, replies of 8 tokens."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if CHROMIUM is None:
        pytest.skip("no chromium executable (Debian: apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page()
        page.goto(server.url + "/")
        page.fill("#api_key", API_KEY)
        page.dispatch_event("#api_key", "change")
        page.wait_for_function("document.getElementById('model').textContent.includes('context')")
        page.fill("#max_tokens", "8")  # the tiny model's context is 256 positions
        yield page
        browser.close()


def test_a_failed_turn_is_not_sent_again(chat_page):
    sent = _sent(chat_page)
    chat_page.fill("#top_p", "5")  # the server refuses it: top_p must be in (0, 1]
    _turn(chat_page, "w10 w11", 0)
    assert "top_p must be in (0, 1]" in chat_page.locator(".msg.error").inner_text()
    chat_page.fill("#top_p", "1")
    _turn(chat_page, "w12 w13", 1)
    assert [m["content"] for m in sent[1]["messages"]] == ["w12 w13"]


def test_an_emptied_max_tokens_is_left_to_the_server_not_sent_as_0(chat_page):
    sent = _sent(chat_page)
    chat_page.fill("#temperature", "0")
    chat_page.fill("#max_tokens", "")
    _turn(chat_page, "w10 w11", 0)
    assert "max_tokens" not in sent[0] and sent[0]["temperature"] == 0
    assert chat_page.locator(".msg.error").count() == 0 and chat_page.locator(".msg.assistant").inner_text()


def test_the_system_prompt_box_says_that_empty_sends_none(chat_page):
    sent = _sent(chat_page)
    placeholder = chat_page.get_attribute("#system", "placeholder")
    _turn(chat_page, "w10", 0)
    assert [m["role"] for m in sent[0]["messages"]] == ["user"]
    assert "empty: no system message" in placeholder  # a hint, not a value it looks like it sends
    chat_page.fill("#system", "w7 w8")
    _turn(chat_page, "w11", 1)
    assert sent[1]["messages"][0] == {"role": "system", "content": "w7 w8"}
