"""The web bins a text by the tokens the worker will compute, with no torch loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from carpool.core.settings import load_settings
from tests.conftest import make_env
from tests.support.webtools import web_client


def test_a_text_lands_in_the_bin_of_its_wordpiece_token_count(
        redis_url: str, key_prefix: str, client: object) -> None:
    settings = load_settings(make_env(redis_url, key_prefix))
    with web_client(settings) as http:
        short = http.post("/submit", json={"model": "minilm", "input": {"text": "hello world"}})
        words = http.post("/submit", json={"model": "minilm",
                                           "input": {"text": "unbelievably " * 10}})
        long = http.post("/submit", json={"model": "minilm", "input": {"text": "word " * 3000}})
    assert short.status_code == words.status_code == long.status_code == 202
    assert short.get_json()["bin"] == "t16"  # [CLS] hello world [SEP]
    assert words.get_json()["bin"] == "t56"  # "unbelievably" is 5 word pieces: 52 tokens
    assert long.get_json()["bin"] == "t512"  # truncated to the model's limit, not refused


def test_counting_tokens_in_the_web_never_imports_torch() -> None:
    code = ("import sys; from web.app import create_app; from carpool.core.tokens import "
            "count_tokens; from carpool.core.catalogue import load_catalogue; "
            "n = count_tokens(load_catalogue(None).get('minilm'), 'hello world'); "
            "assert n == 4, n; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parent.parent.parent, timeout=60)
