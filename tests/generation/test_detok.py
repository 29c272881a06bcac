"""Text out, token by token: never half a multi-byte character, never moving back; stop
strings are withheld until ruled out and cut from the text."""

from __future__ import annotations

from kern.generation.detok import Detokenizer, TextStream


def _byte_level():
    """A tokenizers Tokenizer whose token i is byte i (GPT-2's byte-to-character map, no
    merges): a multi-byte character spans several tokens."""
    from tokenizers import Tokenizer, decoders, models

    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    hf = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    hf.decoder = decoders.ByteLevel()
    return hf


class ByteTokenizer:
    """Token i is byte i (kern's Tokenizer holds the tokenizers one as `tok`)."""

    tok = _byte_level()

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


def _ids(text: str) -> list[int]:
    return list(text.encode())


def test_no_half_character_is_ever_emitted_and_the_text_is_whole():
    text = "héllo, 世界! 🙂 ok"
    d = Detokenizer(ByteTokenizer())
    pieces = [d.push(t) for t in _ids(text)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[_ids(text).index(0xe4)] == ""  # the first byte of 世 alone says nothing yet


def test_a_stop_string_ends_the_text_before_it():
    s = TextStream(ByteTokenizer(), ("STOP",))
    out = "".join(s.push(t) for t in _ids("abc ST"))
    assert out == "abc"  # " ST" could begin STOP: withheld
    for t in _ids("OP and more"):
        out += s.push(t)
        if s.stopped:
            break
    assert s.stopped and out + s.flush() == "abc "


def test_a_near_miss_is_released():
    s = TextStream(ByteTokenizer(), ("STOP",))
    out = "".join(s.push(t) for t in _ids("a STOW b"))
    assert not s.stopped and out + s.flush() == "a STOW b"


def test_the_earliest_of_several_stop_strings_wins():
    s = TextStream(ByteTokenizer(), ("world", "lo w"))
    out = ""
    for t in _ids("hello world"):
        out += s.push(t)
        if s.stopped:
            break
    assert out + s.flush() == "hel"


def test_the_embedded_models_tokenizer_streams_exactly_its_decoded_text():
    from kern.tokenizer import Tokenizer
    from kern_models.embedded import prepare

    tok = Tokenizer(prepare(progress=False))
    text = "Zürich → 東京: 🙂🚀 naïve café, ¿qué? ½ °C"
    ids = tok.encode(text)
    d = Detokenizer(tok)
    pieces = [d.push(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
