"""Text in and out: a Hugging Face tokenizer.json and its chat template (incremental
detokenizing: kern.generation.detok)."""

from __future__ import annotations

from pathlib import Path

from .files.jsonfiles import read_object
from .errors import KernError


def _chat_template(path: Path, value) -> str | None:
    """tokenizer_config.json's chat_template: a string, or a list of named templates (the one
    named "default" is used)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value):
        default = [t["template"] for t in value if t.get("name") == "default"]
        if default:
            return default[0]
        raise KernError(f"{path}: chat_template lists templates {[t.get('name') for t in value]}, none named 'default'")
    raise KernError(f"{path}: chat_template must be a string or a list of named templates, "
                    f"got a {type(value).__name__}")


def _tojson(x, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    import json

    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise KernError(f"{path}: missing; a checkpoint folder needs its tokenizer.json to run on text")
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
            read_object(path)  # says, in kern's words, when the file is not even a JSON object
            raise KernError(f"{path}: not a tokenizer the tokenizers library can load "
                            "(valid JSON, but its model, normalizer or pre_tokenizer is malformed)") from None
        cfg_path = folder / "tokenizer_config.json"
        self.config_path = cfg_path
        self._compiled = None
        self.config = read_object(cfg_path) if cfg_path.exists() else {}
        self.chat_template = _chat_template(cfg_path, self.config.get("chat_template"))
        tpl = folder / "chat_template.jinja"
        if self.chat_template is None and tpl.is_file():
            self.config_path = tpl
            try:
                self.chat_template = tpl.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise KernError(f"{tpl}: cannot read it: {exc}") from None

    def _special(self, key: str) -> str:
        v = self.config.get(key)
        v = v.get("content", "") if isinstance(v, dict) else (v or "")
        if not isinstance(v, str):
            raise KernError(f"{self.config_path}: {key} must be a string or an object with content, got {v!r}")
        return v

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def __getstate__(self) -> dict:
        """A server's engine process hands its tokenizer to the API process: the compiled
        template holds closures, so it stays behind (the other side compiles its own)."""
        return {**self.__dict__, "_compiled": None}

    def _template(self):
        """The chat template, compiled once (compiling costs milliseconds: a server renders it
        for every request)."""
        if self._compiled is None:
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(msg):
                raise TemplateError(msg)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = _tojson  # Hugging Face's: plain JSON, no HTML escaping of < > &
            self._compiled = env.from_string(self.chat_template)
        return self._compiled

    def chat(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
        """The messages through the chat template; `tools` (OpenAI's function tools) reach its
        tool section, where it has one."""
        if not self.chat_template:
            raise KernError(f"{self.config_path}: this checkpoint's tokenizer has no chat template "
                            "(tokenizer_config.json chat_template)")
        from jinja2.exceptions import TemplateError

        try:
            extra = {} if tools is None else {"tools": tools}
            return self._template().render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self._special("bos_token"), eos_token=self._special("eos_token"), **extra)
        except TemplateError as exc:
            raise KernError(f"{self.config_path}: the chat template fails: {exc}") from None

