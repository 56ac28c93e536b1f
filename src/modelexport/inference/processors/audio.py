"""``ONNXFeatureExtractor``: waveforms (arrays or .wav files) -> ``input_values`` or spectrogram features.

Raw-waveform graphs (``input_values``) are handled here: zero-mean unit-variance normalisation as
transformers' Wav2Vec2-style extractors do, padded per batch (or to a fixed length). Spectrogram graphs
(``input_features``) use the transformers feature extractor class named in the config.
"""

from __future__ import annotations

import os
import wave
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InferenceError
from ..graph import GraphInput
from .base import BaseONNXProcessor

__all__ = ["ONNXFeatureExtractor", "read_audio"]


def read_audio(source: Any, sampling_rate: int) -> np.ndarray:
    """A mono float32 waveform at ``sampling_rate`` from an array or a PCM .wav file."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise InferenceError(f"audio file not found: {path}")
        try:
            with wave.open(str(path), "rb") as wav:
                rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
                raw = wav.readframes(wav.getnframes())
        except (wave.Error, EOFError) as exc:
            raise InferenceError(f"{path} is not a PCM .wav file: {exc}") from exc
        kinds = {1: (np.uint8, 128.0, 128.0), 2: (np.int16, 0.0, 32768.0), 4: (np.int32, 0.0, 2147483648.0)}
        if width not in kinds:
            raise InferenceError(f"{path}: {8 * width}-bit samples are not supported (8, 16 or 32-bit PCM)")
        dtype, offset, scale = kinds[width]
        data = (np.frombuffer(raw, dtype=dtype).astype(np.float32) - offset) / scale
        data = data.reshape(-1, channels).mean(axis=1)
        if rate != sampling_rate:
            n = int(round(len(data) * sampling_rate / rate))
            data = np.interp(np.linspace(0, len(data) - 1, n), np.arange(len(data)), data).astype(np.float32)
        return data
    arr = np.asarray(source, dtype=np.float32)
    if arr.ndim == 2 and 1 in arr.shape:
        arr = arr.reshape(-1)
    if arr.ndim != 1:
        raise InferenceError(f"audio must be a 1-D waveform (or a .wav path); got shape {arr.shape}")
    return arr


class ONNXFeatureExtractor(BaseONNXProcessor):
    """Audio -> the graph's audio input, padded per batch; fixed lengths are padded or cropped to."""

    kind = "feature_extractor"
    modality = "audio"

    def __init__(self, inputs: list[GraphInput], config: dict[str, Any] | None = None) -> None:
        super().__init__(inputs, config)
        main = self.input("input_values") or self.input("input_features")
        main = main or next((i for i in self.inputs if i.dtype.startswith("float")), None)
        if main is None:
            raise InferenceError(f"no audio input among the graph inputs {[i.name for i in self.inputs]}")
        self.main = main
        self.sampling_rate = int(self.config.get("sampling_rate", 16000))
        self.spectrogram = len(main.shape) == 3
        self.fixed_length = main.dim(-1)

    def _waveforms(self, audio: Any) -> list[np.ndarray]:
        return [read_audio(a, self.sampling_rate) for a in self._require(audio, "audio")]

    def _raw(self, waves: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Pad per batch, then normalise as transformers does: per waveform with a mask, else the padded row."""
        length = self.fixed_length or max(len(w) for w in waves)
        pad = float(self.config.get("padding_value", 0.0))
        values = np.full((len(waves), length), pad, dtype=np.float32)
        mask = np.zeros((len(waves), length), dtype=np.int64)
        for i, w in enumerate(waves):
            values[i, : min(len(w), length)] = w[:length]
            mask[i, : min(len(w), length)] = 1
        if self.config.get("do_normalize", True):
            with_mask = self.config.get("return_attention_mask", True)
            for i, row in enumerate(values):
                n = int(mask[i].sum()) if with_mask else length
                part = row[:n]
                row[:n] = (part - part.mean()) / np.sqrt(part.var() + 1e-7)
        return {self.main.name: values, "attention_mask": mask}

    def _spectrogram(self, waves: list[np.ndarray]) -> dict[str, np.ndarray]:
        import transformers

        name = self.config.get("feature_extractor_type")
        cls = getattr(transformers, str(name), None) if name else None
        if cls is None:
            raise InferenceError(
                f"spectrogram input {self.main.name!r} needs a known feature_extractor_type, got {name!r}"
            )
        extractor = cls.from_dict({k: v for k, v in self.config.items() if k != "feature_extractor_type"})
        out = extractor(waves, sampling_rate=self.sampling_rate, return_tensors="np", padding=True)
        feats = out[self.main.name] if self.main.name in out else next(iter(out.values()))
        if self.fixed_length:
            frames = feats.shape[-1]
            feats = (
                feats[..., : self.fixed_length]
                if frames >= self.fixed_length
                else np.pad(feats, [(0, 0)] * (feats.ndim - 1) + [(0, self.fixed_length - frames)])
            )
        return {self.main.name: feats, **{k: v for k, v in out.items() if k != self.main.name}}

    def __call__(
        self, texts: Any = None, images: Any = None, audio: Any = None, **kwargs: Any
    ) -> dict[str, np.ndarray]:
        waves = self._waveforms(audio)
        return self.cast(self._spectrogram(waves) if self.spectrogram else self._raw(waves))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sampling_rate": self.sampling_rate, "fixed_length": self.fixed_length}
