"""The torch side of a sentence-transformers export: pooling, normalization and the model around them.

Separate from :mod:`.sentence` (which reads the folder) so that ``import modelexport`` stays torch-free:
:mod:`.loading` imports this module only when it builds a sentence-transformers model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import InvalidModelError
from .sentence import SENTENCE_OUTPUTS, SentenceFolder

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["POOLING_MODES", "Pooling", "Normalize", "SentenceEmbedder"]

#: (token embeddings [B, T, H], float mask [B, T, 1]) -> [B, H]; each as sentence-transformers'
#: ``Pooling._forward_padded`` computes it (same clamps, same -inf fill).
PoolFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _mean_parts(tokens: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (tokens * mask).sum(dim=1), torch.clamp(mask.sum(dim=1), min=1e-9)


def _cls(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    first = mask[..., 0].to(torch.int32).argmax(dim=1)  # first real token: 0, or after left padding
    index = first.view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
    return torch.gather(tokens, 1, index).squeeze(1)


def _max(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return tokens.masked_fill(mask == 0, float("-inf")).max(dim=1).values


def _mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total, count = _mean_parts(tokens, mask)
    return total / count


def _mean_sqrt_len(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    total, count = _mean_parts(tokens, mask)
    return total / torch.sqrt(count)


def _weighted_mean(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Weights 1, 2, ... from the first real token, as sentence-transformers 6 counts them (5.x counted from
    position 0 of a left-padded row in its padded path, but from the first token in its packed path)."""
    positions = torch.arange(1, tokens.shape[1] + 1, device=tokens.device, dtype=tokens.dtype)
    first = mask[..., 0].to(torch.int32).argmax(dim=1)  # left padding before the first real token
    weighted = mask * (positions.view(1, -1, 1) - first.view(-1, 1, 1).to(tokens.dtype))
    return (tokens * weighted).sum(dim=1) / torch.clamp(weighted.sum(dim=1), min=1e-9)


def _last_token(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    seq_len = tokens.shape[1]
    values, indices = mask[..., 0].to(torch.int32).flip(1).max(1)
    indices = torch.where(values == 0, seq_len - 1, indices)
    index = (seq_len - indices - 1).view(-1, 1, 1).expand(-1, 1, tokens.shape[-1])
    return torch.gather(tokens * mask, 1, index).squeeze(1)


#: sentence-transformers' pooling modes, by the names its config uses.
POOLING_MODES: dict[str, PoolFn] = {
    "cls": _cls,
    "max": _max,
    "mean": _mean,
    "mean_sqrt_len_tokens": _mean_sqrt_len,
    "weightedmean": _weighted_mean,
    "lasttoken": _last_token,
}


class Pooling(nn.Module):
    """Token embeddings -> one vector per sentence; several modes are concatenated, as sentence-transformers does."""

    def __init__(self, modes: tuple[str, ...]) -> None:
        super().__init__()
        unknown = [m for m in modes if m not in POOLING_MODES]
        if unknown or not modes:
            raise InvalidModelError(
                f"pooling mode {unknown or list(modes)} is not one of {', '.join(POOLING_MODES)}"
            )
        self.modes = modes

    def forward(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
        return torch.cat([POOLING_MODES[m](token_embeddings, mask) for m in self.modes], dim=-1)


class Normalize(nn.Module):
    """Unit L2 length per sentence embedding."""

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(embeddings, p=2, dim=1)


class SentenceEmbedder(nn.Module):
    """Transformer -> Pooling -> (Normalize): ``{"token_embeddings", "sentence_embedding"}``.

    ``config`` and ``main_input_name`` are the transformer's, so example inputs are built as for it.
    """

    def __init__(self, transformer: PreTrainedModel, folder: SentenceFolder) -> None:
        super().__init__()
        self.transformer = transformer
        self.pooling = Pooling(folder.pooling)
        self.normalize = Normalize() if folder.normalize else None
        self.config = transformer.config
        self.main_input_name = getattr(transformer, "main_input_name", "input_ids")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens = self.transformer(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]
        sentence = self.pooling(tokens, attention_mask)
        if self.normalize is not None:
            sentence = self.normalize(sentence)
        return {SENTENCE_OUTPUTS[0]: tokens, SENTENCE_OUTPUTS[1]: sentence}
