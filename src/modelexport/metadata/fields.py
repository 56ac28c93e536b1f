"""What each embedded metadata value must look like: types, ranges and sizes, checked on every read and write.

A valid checksum proves the values were written by something that knew the scheme, not that they are
sane: a re-signed file can hold ``id2label`` as a list or a resample filter 99. Every reader after
this one (processors, pipelines, test-time) may then trust the shape of what it gets; a value that
breaks its rule is one :class:`~modelexport.errors.MetadataError` naming the key and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

from ..errors import MetadataError

__all__ = [
    "check_values",
    "model_config",
    "processor_config",
    "tensor_specs",
    "short_text",
    "versions",
    "json_object",
    "MAX_LABELS",
    "MAX_SIDE",
]

#: More labels than any classifier has (the largest vocabularies are ~10^6).
MAX_LABELS = 10_000_000
#: Largest image side (pixels) a processor config may ask for.
MAX_SIDE = 1 << 16
#: Most stages a per-stage size list may have (vision backbones have 3-5).
MAX_STAGES = 64
#: PIL resampling filters: NEAREST 0, LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5.
_RESAMPLE = range(6)
_MAX_DIM = 1 << 62


class _Bad(Exception):
    pass


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_in(value: object, low: int, high: int, where: str) -> None:
    if not _is_int(value) or not low <= value <= high:
        raise _Bad(f"{where} must be an integer in [{low}, {high}], got {value!r}")


def json_object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _labels(config: dict[str, Any], where: str) -> None:
    id2label = config.get("id2label")
    if id2label is not None:
        json_object(id2label, f"{where}.id2label")
        if len(id2label) > MAX_LABELS:
            raise _Bad(f"{where}.id2label has {len(id2label):,} labels (at most {MAX_LABELS:,})")
        for key, name in id2label.items():
            if not str(key).isdigit() or not isinstance(name, str):
                raise _Bad(f"{where}.id2label must map class indices to names, got {key!r}: {name!r}")
    label2id = config.get("label2id")
    if label2id is not None:
        for name, index in json_object(label2id, f"{where}.label2id").items():
            _int_in(index, 0, MAX_LABELS, f"{where}.label2id[{name!r}]")


#: Model-config sizes the pipelines read: absent or null, else a positive integer, or one per stage (a list:
#: SegFormer's and LeViT's heads and widths, legal transformers configs).
_MODEL_SIZES = (
    "num_labels",
    "num_channels",
    "hidden_size",
    "num_attention_heads",
    "max_position_embeddings",
    "n_head",
    "n_embd",
    "d_model",
)


def model_config(value: object, where: str) -> None:
    config = json_object(value, where)
    _labels(config, where)
    for name in _MODEL_SIZES:
        value = config.get(name)
        if isinstance(value, list) and 1 <= len(value) <= MAX_STAGES:
            for k, stage in enumerate(value):
                _int_in(stage, 0, 1 << 31, f"{where}.{name}[{k}]")
        elif value is not None:
            _int_in(value, 0, 1 << 31, f"{where}.{name}")


def _side_or_sides(value: object, where: str) -> None:
    if isinstance(value, dict):
        for key, side in value.items():
            if side is not None:
                _int_in(side, 1, MAX_SIDE, f"{where}.{key}")
    elif value is not None:
        _int_in(value, 1, MAX_SIDE, where)


def _mean_std(value: object, where: str) -> None:
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= 16 or not all(_is_number(v) for v in items):
        raise _Bad(f"{where} must be a number or a list of 1-16 numbers, got {value!r}")


def processor_config(value: object, where: str) -> None:
    config = json_object(value, where)
    for key, item in config.items():
        field = f"{where}.{key}"
        if key.startswith("do_") and item is not None and not isinstance(item, bool):
            raise _Bad(f"{field} must be true, false or null, got {item!r}")
    checks: dict[str, Callable[[Any, str], None]] = {
        "size": _side_or_sides,
        "crop_size": _side_or_sides,
        "image_mean": _mean_std,
        "image_std": _mean_std,
        "resample": lambda v, w: _int_in(v, _RESAMPLE.start, _RESAMPLE.stop - 1, w),
        "num_channels": lambda v, w: _int_in(v, 1, 64, w),
        "sampling_rate": lambda v, w: _int_in(v, 1, 10_000_000, w),
        "feature_size": lambda v, w: _int_in(v, 1, 1 << 20, w),
    }
    for key, check in checks.items():
        if config.get(key) is not None:
            check(config[key], f"{where}.{key}")
    if config.get("rescale_factor") is not None and not _is_number(config["rescale_factor"]):
        raise _Bad(f"{where}.rescale_factor must be a number, got {config['rescale_factor']!r}")


def tensor_specs(value: object, where: str) -> None:
    if not isinstance(value, list) or len(value) > 100_000:
        raise _Bad(f"{where} must be a list of tensor specs")
    for i, spec in enumerate(value):
        spec = json_object(spec, f"{where}[{i}]")
        if not isinstance(spec.get("name"), str) or not isinstance(spec.get("dtype", ""), str):
            raise _Bad(f"{where}[{i}] needs a string 'name' and 'dtype'")
        shape = spec.get("shape", [])
        if not isinstance(shape, list) or len(shape) > 64:
            raise _Bad(f"{where}[{i}].shape must be a list of at most 64 dimensions")
        for dim in shape:
            if dim is not None and not isinstance(dim, str):
                _int_in(dim, 0, _MAX_DIM, f"{where}[{i}].shape")


def short_text(value: object, where: str) -> None:
    if not isinstance(value, str) or len(value) > 1000:
        raise _Bad(f"{where} must be a short string, got {type(value).__name__}")


def versions(value: object, where: str) -> None:
    """Library name -> version string, both short text."""
    for name, version in json_object(value, where).items():
        if not isinstance(version, str) or not 0 < len(version) <= 64 or len(name) > 64:
            raise _Bad(f"{where} must map library names to version strings, got {name!r}: {version!r}")


def check_values(values: dict[str, Any], checks: dict[str, Callable[[Any, str], None]]) -> None:
    """Raise MetadataError for the first decoded value that breaks the rule ``checks`` gives its key."""
    for key, check in checks.items():
        if key in values:
            try:
                check(values[key], key)
            except _Bad as exc:
                raise MetadataError(
                    f"embedded metadata is invalid: {exc}",
                    hint="re-export, or fix the value with `modelexport metadata MODEL --set KEY=VALUE`",
                ) from None
