"""logit_bias, several prompts in one /v1/completions request, echo, and /tokenize and
/detokenize in vLLM's shapes, on the tiny word-tokenizer server (token i is the word `w{i}`)."""

from __future__ import annotations

import pytest

from .conftest import CONTEXT, post, words

GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


def _ids(server, text: str) -> list[int]:
    return server.driver.info.tokenizer.encode(text)


def test_a_large_bias_makes_a_token_every_token(client, model_name, server):
    (w77,) = _ids(server, "w77")
    out = client.completions.create(model=model_name, prompt=words(5), max_tokens=6, temperature=0,
                                    logit_bias={str(w77): 100}, extra_body={"ignore_eos": True})
    assert out.choices[0].text.split() == ["w77"] * 6


def test_a_large_negative_bias_rules_the_greedy_token_out(client, model_name, server):
    free = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": words(4, 30)}],
                                          max_tokens=3, **GREEDY)
    first = _ids(server, free.choices[0].message.content.split()[0])[0]
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": words(4, 30)}],
                                         max_tokens=3, temperature=0, logit_bias={str(first): -100},
                                         extra_body={"ignore_eos": True})
    assert first not in _ids(server, out.choices[0].message.content)


def test_several_prompts_give_each_prompt_its_own_choices(client, model_name):
    prompts = [words(5, 10), words(7, 50), [60, 61, 62]]
    out = client.completions.create(model=model_name, prompt=prompts, n=2, max_tokens=4, temperature=0.8, seed=9,
                                    extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == list(range(6))
    for k, p in enumerate(prompts):  # choices 2k and 2k + 1 are what prompt k gets alone
        alone = client.completions.create(model=model_name, prompt=p, n=2, max_tokens=4, temperature=0.8, seed=9,
                                          extra_body={"ignore_eos": True})
        assert [c.text for c in out.choices[2 * k:2 * k + 2]] == [c.text for c in alone.choices]
    assert out.usage.prompt_tokens == 5 + 7 + 3 and out.usage.completion_tokens == 6 * 4
    parts = list(client.completions.create(model=model_name, prompt=prompts, n=2, max_tokens=4, temperature=0.8,
                                           seed=9, stream=True, extra_body={"ignore_eos": True}))
    streamed = ["".join(p.choices[0].text for p in parts if p.choices[0].index == i) for i in range(6)]
    assert streamed == [c.text for c in out.choices]


def test_echo_starts_each_text_with_its_prompt(client, model_name):
    # prompts apart from the other tests' (the server is shared: a common prefix would be cached)
    plain = client.completions.create(model=model_name, prompt=[words(3, 160), [70, 71]], max_tokens=3, **GREEDY)
    out = client.completions.create(model=model_name, prompt=[words(3, 160), [70, 71]], max_tokens=3, echo=True,
                                    **GREEDY)
    assert [c.text for c in out.choices] == [words(3, 160) + plain.choices[0].text, "w70 w71" + plain.choices[1].text]
    parts = list(client.completions.create(model=model_name, prompt=words(3, 160), max_tokens=3, echo=True,
                                           stream=True, **GREEDY))
    assert parts[0].choices[0].text == words(3, 160)
    assert "".join(p.choices[0].text for p in parts) == out.choices[0].text


def test_tokenize_a_prompt_and_chat_messages_as_the_completions_see_them(server, client, model_name):
    code, out = post(server, "/tokenize", {"model": model_name, "prompt": "w5 w6 w7", "return_token_strs": True})
    assert code == 200
    assert out == {"count": 3, "max_model_len": CONTEXT, "tokens": [5, 6, 7], "token_strs": ["w5", "w6", "w7"]}
    msgs = [{"role": "user", "content": words(4)}]
    code, chat = post(server, "/tokenize", {"messages": msgs})
    used = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=1)
    assert code == 200 and chat["count"] == used.usage.prompt_tokens and chat["token_strs"] is None
    code, back = post(server, "/detokenize", {"model": model_name, "tokens": out["tokens"]})
    assert code == 200 and back == {"prompt": "w5 w6 w7"}


@pytest.mark.parametrize("path,body,param,says", [
    ("/tokenize", {"model": "MODEL"}, "prompt", "send one of prompt or messages"),
    ("/tokenize", {"prompt": "w5", "messages": []}, "prompt", "send one of prompt or messages"),
    ("/tokenize", {"prompt": 5}, "prompt", "prompt must be a string, got an integer"),
    ("/tokenize", {"prompt": "w5", "add_special_tokens": "no"}, "add_special_tokens", "must be a boolean"),
    ("/tokenize", {"prompt": "w5", "frobnicate": 1}, "frobnicate", "unsupported parameter 'frobnicate'"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens", "outside the vocabulary"),
    ("/detokenize", {"tokens": "w5"}, "tokens", "tokens must be an array of token ids"),
    ("/detokenize", {"model": "gpt-17", "tokens": [1]}, "model", "'gpt-17' does not exist"),
])
def test_tokenize_and_detokenize_refuse_bad_input_naming_the_field(server, model_name, path, body, param, says):
    body = {k: (model_name if v == "MODEL" else v) for k, v in body.items()}
    code, out = post(server, path, body)
    assert code == (404 if param == "model" else 400)
    assert out["error"]["param"] == param and says in out["error"]["message"]


def test_a_grammar_over_a_tokenizer_llguidance_cannot_read_is_refused_saying_so(server, model_name):
    """The word tokenizer has no byte-level decoder: the server starts all the same, and a
    request with a schema gets one line naming why, not a failure of the engine."""
    code, out = post(server, "/v1/completions", {"model": model_name, "prompt": "w5", "max_tokens": 2,
                                                 "response_format": {"type": "json_object"}})
    assert code == 400 and out["error"]["param"] == "prompt"
    assert "structured output cannot read this checkpoint's tokenizer" in out["error"]["message"]
    code, _ = post(server, "/v1/completions", {"model": model_name, "prompt": "w5", "max_tokens": 2})
    assert code == 200
