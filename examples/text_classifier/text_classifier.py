"""A Hugging Face ``transformers`` sequence classifier for carpool.

It loads a local model folder (``options.weights``: ``config.json`` plus weights,
as ``save_pretrained`` writes it), or, without one, builds a small BERT from a
config with random weights (``options.random = true``: for trying the path out
and for tests; it never downloads anything).

Texts are tokenized with ``carpool.core.tokens`` — the WordPiece tokenizer the web
counts tokens with — so each text lands in the bin that holds it, and a batch is
padded to its bin's length, not to its longest text.

Catalogue entry: ``catalogue.toml`` beside this file. Input ``{"text": str}``;
result ``{"label": str, "scores": {label: probability}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from carpool.core.catalogue import BinSpec, ModelSpec
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.tokens import WordPiece, tokenizer_for
from worker.handlers.tuning import HandlerContext

#: Token id of [PAD] in BERT vocabularies.
PAD_ID = 0
#: The random model's size: small enough to build in a second on a CPU.
TINY_BERT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 128}


class SequenceClassifier:
    def __init__(self, spec: ModelSpec, context: HandlerContext) -> None:
        self.spec = spec
        self.context = context
        self.tokenizer: WordPiece = tokenizer_for(spec)
        self.labels = [str(label) for label in spec.options.get("labels", ["0", "1"])]
        self.model: torch.nn.Module | None = None

    def _build(self) -> torch.nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        opts = self.spec.options
        if opts.get("weights"):
            from transformers import AutoModelForSequenceClassification

            folder = Path(str(opts["weights"]))
            if not (folder / "config.json").is_file():
                raise ConfigError(f"model {self.spec.name!r}: {folder} has no config.json")
            model: torch.nn.Module = AutoModelForSequenceClassification.from_pretrained(
                # safetensors only: a pytorch_model.bin is a pickle, never loaded here.
                str(folder), local_files_only=True, use_safetensors=True)
            return model
        if not opts.get("random"):
            raise ConfigError(f"model {self.spec.name!r}: set options.weights to a model "
                              "folder, or options.random = true for random weights")
        torch.manual_seed(int(opts.get("seed", 0)))
        config = BertConfig(vocab_size=self.tokenizer.vocab_size, num_labels=len(self.labels),
                            max_position_embeddings=self.tokenizer.config.max_tokens,
                            **TINY_BERT)
        return BertForSequenceClassification(config)

    def load(self) -> None:
        self.model = self.context.prepare(self._build())

    def preprocess(self, job_input: Any) -> torch.Tensor:
        text = job_input.get("text") if isinstance(job_input, dict) else None
        if not isinstance(text, str):
            raise InvalidInput("input must be {'text': str}")
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.int64)

    def example(self, bin_spec: BinSpec) -> torch.Tensor:
        return torch.full((self._length(bin_spec),), 1000, dtype=torch.int64)

    def _length(self, bin_spec: BinSpec) -> int:
        return min(bin_spec.max_size, self.tokenizer.config.max_tokens)

    def collate(self, items: Sequence[torch.Tensor], bin_spec: BinSpec) -> dict[str, Any]:
        length = self._length(bin_spec)  # the bin's length: one shape per bin
        ids = torch.full((len(items), length), PAD_ID, dtype=torch.int64)
        mask = torch.zeros((len(items), length), dtype=torch.int64)
        for row, item in enumerate(items):
            if item.shape[0] > length:
                raise InvalidInput(f"{item.shape[0]} tokens; bin {bin_spec.name!r} holds {length}")
            ids[row, :item.shape[0]] = item
            mask[row, :item.shape[0]] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        assert self.model is not None, "load() first"
        logits = self.model(**batch).logits
        return torch.softmax(logits.float(), dim=-1)

    def postprocess(self, output: torch.Tensor, n: int) -> list[Any]:
        results = []
        for row in output.tolist():
            best = max(range(len(row)), key=row.__getitem__)
            results.append({"label": self.labels[best],
                            "scores": {label: round(p, 6) for label, p in zip(
                                self.labels, row, strict=True)}})
        return results
