"""Text in and out: a Hugging Face tokenizer.json and its chat template (incremental
detokenizing: kern.generation.detok)."""

from __future__ import annotations

import json
from pathlib import Path

from .runtime.errors import KernError


class Tokenizer:
    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise KernError(f"{folder}: no tokenizer.json in the checkpoint folder")
        self.tok = HFTokenizer.from_file(str(path))
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template = self.config.get("chat_template")
        tpl = folder / "chat_template.jinja"
        if self.chat_template is None and tpl.is_file():
            self.chat_template = tpl.read_text()

    def _special(self, key: str) -> str:
        v = self.config.get(key)
        return v.get("content", "") if isinstance(v, dict) else (v or "")

    def encode(self, text: str, special: bool = False) -> list[int]:
        return self.tok.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise KernError("this checkpoint's tokenizer has no chat template (tokenizer_config.json chat_template)")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self._special("bos_token"), eos_token=self._special("eos_token"))

