"""A live server over the embedded model (SmolLM2-135M-Instruct) on the CPU, for what a word
tokenizer cannot show: JSON decoded under a schema, tool calls. Its checkpoint folder is the
embedded one's files with a chat template that adds a hermes tool section to SmolLM2's own
(templates/hermes_tools.jinja; without tools it renders exactly what SmolLM2's does)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from kern.serve.server import start  # noqa: E402

from . import engines  # noqa: E402

CONTEXT = 768
MAX_SEQS = 24


def tool_checkpoint(folder: Path) -> Path:
    from kern_models.embedded import prepare

    ckpt = prepare(progress=False)
    for f in ckpt.iterdir():
        if f.name != "tokenizer_config.json":
            (folder / f.name).symlink_to(f)
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (Path(__file__).parent / "templates" / "hermes_tools.jinja").read_text()
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    running = start(partial(engines.model_loop, tool_checkpoint(tmp_path_factory.mktemp("smol-tools")), CONTEXT,
                            MAX_SEQS))
    yield running
    running.close()


@pytest.fixture(scope="module")
def smol_client(smol):
    return openai.OpenAI(base_url=smol.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def smol_name(smol) -> str:
    return smol.driver.info.model_name
