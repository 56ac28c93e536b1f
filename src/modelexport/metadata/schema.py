"""Metadata schema 2.0: key names, value encoding (JSON, gzip over 10 KB) and the checksum.

Every value modelexport writes is listed in an encoding manifest (``modelexport.metadata_encoding``),
so a reader knows how to decode it, and a SHA-256 over the manifest and the listed values
(``modelexport.metadata_checksum``) makes a tampered or truncated value an error, not a wrong pipeline.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import zlib
from collections.abc import Callable
from typing import Any

from .._io import parse_json
from ..errors import MetadataError, MetadataIntegrityError
from . import fields

__all__ = [
    "METADATA_VERSION",
    "COMPRESS_THRESHOLD",
    "KEY_VERSION",
    "KEY_MODEL_CONFIG",
    "KEY_PROCESSOR_CONFIG",
    "KEY_TASK",
    "KEY_TIMESTAMP",
    "KEY_EXPORTER_VERSION",
    "KEY_LIBRARIES",
    "KEY_EXPORT_CONFIG",
    "KEY_INPUTS",
    "KEY_OUTPUTS",
    "KEY_QUANTIZATION",
    "KEY_TEST_TIME_POLICY",
    "KEY_INPUT_NOISE",
    "KEY_SOURCE_ANCHORS",
    "KEY_TEST_TIME_ENSEMBLE",
    "KEY_GENERATION",
    "CACHE_INPUT_PREFIX",
    "KEY_EMBEDDING",
    "KEY_ENCODING",
    "KEY_CHECKSUM",
    "VALUE_CHECKS",
    "encode_entries",
    "decode_entries",
]

METADATA_VERSION = "2.0"
#: Encoded values larger than this (bytes) are gzip-compressed.
COMPRESS_THRESHOLD = 10 * 1024
_GZIP_PREFIX = "gzip+base64:"
#: Decompressed values are refused above this size (a gzip bomb in a re-signed file).
MAX_VALUE_BYTES = 64 * 1024 * 1024
_EDITED = "the value was truncated or edited outside modelexport; re-export the model"

KEY_VERSION = "hf_metadata_version"
KEY_MODEL_CONFIG = "hf_model_config"
KEY_PROCESSOR_CONFIG = "hf_processor_config"
KEY_TASK = "hf_pipeline_task"
KEY_TIMESTAMP = "hf_export_timestamp"
KEY_EXPORTER_VERSION = "modelexport.version"
#: Versions of the libraries the export ran with (transformers, tokenizers, torch, ...).
KEY_LIBRARIES = "modelexport.libraries"
KEY_EXPORT_CONFIG = "modelexport.export_config"
KEY_INPUTS = "modelexport.inputs"
KEY_OUTPUTS = "modelexport.outputs"
KEY_QUANTIZATION = "modelexport.quantization"
KEY_TEST_TIME_POLICY = "modelexport.test_time_policy"
#: ``{"members": [file names beside the model]}``: the models whose probabilities are averaged with this one's
#: (the pipeline's ``--ensemble int8``: the int8 model and its fp32 twin); pipelines apply it like the policy.
KEY_TEST_TIME_ENSEMBLE = "modelexport.test_time_ensemble"
#: Generation graphs (``*-with-past``): cache layout and names, generation config (export/generation.py).
KEY_GENERATION = "modelexport.generation"
#: The graph inputs that carry a key/value cache (Optimum's names, ``past_key_values.{layer}...``), which every
#: generation graph of ours takes and every reader of one looks for.
CACHE_INPUT_PREFIX = "past_key_values."
#: Sentence-embedding graphs (a sentence-transformers folder): pooling, normalize, the output to return.
KEY_EMBEDDING = "modelexport.embedding"
#: The source images' noise and sharpness (``testtime/denoise.py``: ``{"floor", "strength", "sharp_floor",
#: "sharpen", "examples", "estimator"}``): the image pipeline measures the floors on its training images and
#: calibrates the strengths on its validation images; test-time adaptation restores inputs only for models
#: that carry it.
KEY_INPUT_NOISE = "modelexport.input_noise"
#: A few of the source's own examples per class, as model inputs (``testtime/anchors.py``: ``{"shape",
#: "labels", "encoding", "data"}``, float16 in base64): the image pipeline records them beside the input-noise
#: record (unless ``--anchors false``), and test-time adaptation measures a noisy stream's deep BN variances
#: against them.
KEY_SOURCE_ANCHORS = "modelexport.source_anchors"
KEY_ENCODING = "modelexport.metadata_encoding"
KEY_CHECKSUM = "modelexport.metadata_checksum"
_RESERVED = (KEY_ENCODING, KEY_CHECKSUM)

#: The shape each value must have (see :mod:`.fields`), checked on encode and on every verified decode:
#: a valid checksum proves who wrote a value, not that it is sane. Keys not listed hold any JSON.
VALUE_CHECKS: dict[str, Callable[[Any, str], None]] = {
    KEY_MODEL_CONFIG: fields.model_config,
    KEY_PROCESSOR_CONFIG: fields.processor_config,
    KEY_TASK: fields.short_text,
    KEY_INPUTS: fields.tensor_specs,
    KEY_OUTPUTS: fields.tensor_specs,
    KEY_TEST_TIME_POLICY: fields.json_object,
    KEY_TEST_TIME_ENSEMBLE: fields.json_object,
    KEY_QUANTIZATION: fields.json_object,
    KEY_EXPORT_CONFIG: fields.json_object,
    KEY_EMBEDDING: fields.json_object,
    KEY_INPUT_NOISE: fields.json_object,
    KEY_SOURCE_ANCHORS: fields.json_object,
    KEY_LIBRARIES: fields.versions,
}


def _encode_value(value: object) -> tuple[str, str]:
    """(stored string, encoding): plain strings stay readable, everything else is JSON; big values gzip."""
    if isinstance(value, str):
        text, kind = value, "text"
    else:
        try:
            text, kind = json.dumps(value, sort_keys=True, separators=(",", ":")), "json"
        except (TypeError, ValueError) as exc:
            raise MetadataError(
                f"metadata value of type {type(value).__name__} is not JSON-serialisable: {exc}"
            ) from exc
    if len(text.encode("utf-8")) > COMPRESS_THRESHOLD:
        packed = base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")
        return _GZIP_PREFIX + packed, f"gzip+{kind}"
    return text, kind


def _checksum(stored: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for key in sorted(stored):
        digest.update(key.encode("utf-8") + b"\0" + stored[key].encode("utf-8") + b"\0")
    return "sha256:" + digest.hexdigest()


def encode_entries(values: dict[str, Any], foreign: dict[str, str] | None = None) -> dict[str, str]:
    """Stored ``metadata_props`` for decoded ``values``, with the manifest and checksum added.

    ``foreign`` are raw entries written by other tools: kept as they are, outside the checksum.
    """
    fields.check_values(values, VALUE_CHECKS)
    stored: dict[str, str] = {}
    encoding: dict[str, str] = {}
    for key, value in values.items():
        if key in _RESERVED:
            continue
        if not isinstance(key, str) or not key:
            raise MetadataError(f"metadata keys must be non-empty strings, got {key!r}")
        stored[key], encoding[key] = _encode_value(value)
    stored[KEY_ENCODING] = json.dumps(encoding, sort_keys=True, separators=(",", ":"))
    stored[KEY_CHECKSUM] = _checksum(stored)
    return {**(foreign or {}), **stored}


def _gunzip(packed: bytes) -> bytes:
    """Decompress at most MAX_VALUE_BYTES (plus one to notice more)."""
    with gzip.GzipFile(fileobj=io.BytesIO(packed)) as fh:
        data = fh.read(MAX_VALUE_BYTES + 1)
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(f"it decompresses to more than {MAX_VALUE_BYTES:,} bytes")
    return data


def _decode_value(key: str, raw: str, kind: str) -> Any:
    text = raw
    if kind.startswith("gzip+"):
        if not raw.startswith(_GZIP_PREFIX):
            raise MetadataIntegrityError(f"metadata value {key!r} is marked compressed but is not")
        try:
            text = _gunzip(base64.b64decode(raw[len(_GZIP_PREFIX) :], validate=True)).decode("utf-8")
        except (ValueError, OSError, EOFError, zlib.error) as exc:
            raise MetadataIntegrityError(f"compressed metadata value {key!r} is corrupted: {exc}") from exc
        kind = kind[len("gzip+") :]
    if kind == "text":
        return text
    return parse_json(text, f"metadata value {key!r}", MetadataIntegrityError, _EDITED)


def decode_entries(stored: dict[str, str], *, verify: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """(decoded modelexport values, foreign raw entries). Raises MetadataIntegrityError on a bad checksum."""
    if KEY_ENCODING not in stored:
        if verify and KEY_CHECKSUM in stored:  # a signature over nothing: the manifest was removed
            raise MetadataIntegrityError(f"metadata has a {KEY_CHECKSUM!r} but no manifest {KEY_ENCODING!r}")
        if verify:  # our keys written by another tool (or left by a damaged manifest) still obey their rules
            fields.check_values(stored, VALUE_CHECKS)
        return {}, dict(stored)
    encoding = parse_json(
        stored[KEY_ENCODING], f"the metadata manifest {KEY_ENCODING!r}", MetadataIntegrityError
    )
    if not isinstance(encoding, dict) or not all(isinstance(k, str) for k in encoding.values()):
        raise MetadataIntegrityError(f"the metadata manifest {KEY_ENCODING!r} is not an object of encodings")
    missing = [k for k in encoding if k not in stored]
    if missing:
        raise MetadataIntegrityError(f"metadata entries listed in the manifest are missing: {missing}")
    covered = {k: stored[k] for k in (*encoding, KEY_ENCODING)}
    if verify:
        expected = stored.get(KEY_CHECKSUM)
        if expected is None:
            raise MetadataIntegrityError(f"metadata has a manifest but no {KEY_CHECKSUM!r}")
        actual = _checksum(covered)
        if actual != expected:
            raise MetadataIntegrityError(
                f"metadata checksum mismatch (stored {expected[:19]}..., computed {actual[:19]}...): "
                "a value was modified or truncated outside modelexport"
            )
    values = {k: _decode_value(k, stored[k], kind) for k, kind in encoding.items()}
    foreign = {k: v for k, v in stored.items() if k not in covered and k != KEY_CHECKSUM}
    if verify:
        fields.check_values({**foreign, **values}, VALUE_CHECKS)
    return values, foreign
