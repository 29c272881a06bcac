"""The official `openai` client, unmodified, against a live kern server: what clients rely on."""

from __future__ import annotations

import time

import pytest

from .conftest import get, leased_pages, wait_idle, words

GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_served_model(client, model_name):
    (m,) = client.models.list().data
    assert m.id == model_name and m.owned_by == "kern"
    assert 1_700_000_000 < m.created <= time.time()  # when the server started serving it, not 0


def test_the_model_answers_to_the_path_it_was_started_with(client, checkpoint):
    """vLLM's convention: the model id is the model argument as given (`kern serve PATH`)."""
    r = client.chat.completions.create(model=str(checkpoint), messages=[{"role": "user", "content": "w10"}],
                                       max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_non_streaming_chat_returns_one_body_with_usage(client, model_name, server):
    out = client.chat.completions.create(model=model_name, messages=chat(words(5)), max_tokens=6, **GREEDY)
    (c,) = out.choices
    assert out.object == "chat.completion" and c.message.role == "assistant"
    assert c.finish_reason == "length" and len(c.message.content.split()) == 6
    tok = server.driver.info.tokenizer
    assert out.usage.prompt_tokens == len(tok.encode(tok.chat(chat(words(5)))))
    assert out.usage.completion_tokens == 6
    assert out.usage.total_tokens == out.usage.prompt_tokens + 6


def test_streaming_chat_matches_the_body_and_ends_with_usage(client, model_name):
    whole = client.chat.completions.create(model=model_name, messages=chat(words(7)), max_tokens=8, **GREEDY)
    chunks = list(client.chat.completions.create(model=model_name, messages=chat(words(7)), max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}, **GREEDY))
    *body, last_choice, usage = chunks
    assert body[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].finish_reason is None for ch in body)
    assert last_choice.choices[0].finish_reason == "length"
    assert "".join(ch.choices[0].delta.content or "" for ch in body) == whole.choices[0].message.content
    assert usage.choices == [] and usage.usage.completion_tokens == 8
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_stream_and_body_agree(client, model_name):
    whole = client.completions.create(model=model_name, prompt=words(9), max_tokens=5, **GREEDY)
    parts = list(client.completions.create(model=model_name, prompt=words(9), max_tokens=5, stream=True, **GREEDY))
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text
    assert [p.choices[0].finish_reason for p in parts][-1] == "length"
    assert all(p.choices[0].finish_reason is None for p in parts[:-1])


def test_a_stop_string_ends_the_text_before_it(client, model_name):
    free = client.completions.create(model=model_name, prompt=words(6, 40), max_tokens=8, **GREEDY)
    said = free.choices[0].text.split()
    stop = said[3]
    cut = said[:said.index(stop)]
    out = client.completions.create(model=model_name, prompt=words(6, 40), max_tokens=8, stop=[" " + stop],
                                    **GREEDY)
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text.split() == cut


def test_a_stop_token_id_ends_generation(client, model_name, server):
    free = client.completions.create(model=model_name, prompt=words(6, 70), max_tokens=8, **GREEDY)
    ids = server.driver.info.tokenizer.encode(free.choices[0].text)
    out = client.completions.create(model=model_name, prompt=words(6, 70), max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, "stop_token_ids": [ids[2]]})
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens <= 3


def test_the_same_seed_reproduces_a_sampled_answer(client, model_name):
    def sample(seed):
        return client.completions.create(model=model_name, prompt=words(4), max_tokens=12, temperature=1.5,
                                         seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first


def test_n_choices_are_indexed_and_each_reproducible(client, model_name):
    def ask():
        return client.chat.completions.create(model=model_name, messages=chat(words(3)), max_tokens=10, n=3,
                                              temperature=1.5, seed=11, extra_body={"ignore_eos": True})

    out = ask()
    assert [c.index for c in out.choices] == [0, 1, 2]
    texts = [c.message.content for c in out.choices]
    assert len(set(texts)) > 1
    assert [c.message.content for c in ask().choices] == texts
    assert out.usage.completion_tokens == 30


def test_streamed_n_choices_each_end_once(client, model_name):
    seen = {0: [], 1: []}
    for ch in client.completions.create(model=model_name, prompt=words(3), max_tokens=4, n=2, stream=True,
                                        **GREEDY):
        (c,) = ch.choices
        seen[c.index].append(c.finish_reason)
    assert all(fin[-1] == "length" and set(fin[:-1]) <= {None} for fin in seen.values())


def test_chat_logprobs(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=chat(words(4)), max_tokens=5, logprobs=True,
                                         top_logprobs=3, **GREEDY)
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    # the text continues the prompt's (generation/detok.py): the word tokenizer spaces its first word
    assert " " + " ".join(t.token for t in content) == out.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert t.top_logprobs[0].token == t.token  # greedy picks the most likely
        assert t.bytes == list(t.token.encode())


def test_completion_logprobs(client, model_name):
    out = client.completions.create(model=model_name, prompt=words(4), max_tokens=4, logprobs=2, **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(top) <= 2 and max(top.values()) >= v for top, v in zip(lp.top_logprobs, lp.token_logprobs))


def test_a_repeated_prefix_is_served_from_the_cache(client, model_name):
    prompt = words(100, 20)
    first = client.completions.create(model=model_name, prompt=prompt, max_tokens=2, **GREEDY)
    again = client.completions.create(model=model_name, prompt=prompt + " w9", max_tokens=2, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= 64
    assert again.choices[0].text  # a cached prefix still answers


def test_a_multi_turn_session_reuses_its_history(client, model_name):
    messages = [{"role": "system", "content": words(20, 100)}]
    cached = []
    for turn in range(3):
        messages.append({"role": "user", "content": words(12, 30 + 20 * turn)})
        out = client.chat.completions.create(model=model_name, messages=messages, max_tokens=6, **GREEDY)
        messages.append({"role": "assistant", "content": out.choices[0].message.content})
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
        assert out.usage.prompt_tokens > (turn and previous)
        previous = out.usage.prompt_tokens
    assert cached[1] > 0 and cached[2] > cached[1]


def test_abort_mid_stream_frees_the_lease(client, model_name, server):
    before = leased_pages(server)
    stream = client.chat.completions.create(model=model_name, messages=chat(words(30, 150)), max_tokens=200,
                                            stream=True, **GREEDY)
    got = 0
    for ch in stream:
        got += bool(ch.choices[0].delta.content)
        if got == 3:
            assert server.driver.stats.running == 1  # still generating: 200 tokens were asked for
            break
    stream.close()
    assert leased_pages(server) == before
    status, text = get(server, "/metrics")
    assert status == 200 and "kern_running_sequences 0.0" in text

