"""``ONNXFeatureExtractor``: waveforms (arrays or .wav files) -> ``input_values`` or spectrogram features.

The features are transformers' own feature extractor's (built from the model's
``preprocessor_config.json`` or its embedded config), raw waveforms and spectrograms alike. Only what
the graph fixes is adapted: a fixed waveform length is padded/truncated to by the extractor, a fixed
number of spectrogram frames is cut or zero-padded to, and an ``attention_mask`` graph input asks the
extractor for its mask.
"""

from __future__ import annotations

import os
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InferenceError
from ...metadata.build import hf_processor
from ..graph import GraphInput
from .base import AudioInput, BaseONNXProcessor, ImageInput

if TYPE_CHECKING:
    from transformers import SequenceFeatureExtractor

__all__ = ["ONNXFeatureExtractor", "read_audio"]


def read_audio(source: AudioInput, sampling_rate: int) -> np.ndarray:
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

    def __init__(
        self,
        inputs: list[GraphInput],
        config: dict[str, Any] | None = None,
        *,
        processor: SequenceFeatureExtractor | None = None,
        model_type: str | None = None,
    ) -> None:
        super().__init__(inputs, processor.to_dict() if processor is not None else config)
        main = self.input("input_values") or self.input("input_features")
        main = main or next((i for i in self.inputs if i.dtype.startswith("float")), None)
        if main is None:
            raise InferenceError(f"no audio input among the graph inputs {[i.name for i in self.inputs]}")
        self.main = main
        self.extractor = (
            processor if processor is not None else hf_processor(self.config, self.kind, model_type)
        )
        self.sampling_rate = int(getattr(self.extractor, "sampling_rate", None) or 16000)
        self.spectrogram = len(main.shape) == 3
        self.fixed_length = main.dim(-1)

    @property
    def transformers_classes(self) -> list[str]:
        return [type(self.extractor).__name__]

    def _options(self) -> dict[str, Any]:
        """Call options: what the graph fixes, else the extractor's own defaults (raw batches pad to the longest)."""
        options: dict[str, Any] = {"sampling_rate": self.sampling_rate, "return_tensors": "np"}
        if not self.spectrogram:
            options["padding"] = True
            if self.fixed_length:
                options.update(padding="max_length", max_length=self.fixed_length, truncation=True)
        if self.input("attention_mask") is not None:
            options["return_attention_mask"] = True
        return options

    def _fix_frames(self, feats: np.ndarray) -> np.ndarray:
        if not (self.spectrogram and self.fixed_length) or feats.shape[-1] == self.fixed_length:
            return feats
        if feats.shape[-1] > self.fixed_length:
            return feats[..., : self.fixed_length]
        return np.pad(feats, [(0, 0)] * (feats.ndim - 1) + [(0, self.fixed_length - feats.shape[-1])])

    def __call__(
        self,
        texts: str | Sequence[str] | None = None,
        images: ImageInput | Sequence[ImageInput] | None = None,
        audio: AudioInput | Sequence[AudioInput] | None = None,
        **kwargs: object,
    ) -> dict[str, np.ndarray]:
        waves = [read_audio(a, self.sampling_rate) for a in self._require(audio, "audio")]
        out = dict(self.extractor(waves, **self._options()))
        key = next((k for k in ("input_values", "input_features") if k in out), next(iter(out)))
        feeds = {k: np.asarray(v) for k, v in out.items() if k != key}
        feeds[self.main.name] = self._fix_frames(np.asarray(out[key]))
        return self.cast(feeds)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "transformers_class": type(self.extractor).__name__,
            "sampling_rate": self.sampling_rate,
            "fixed_length": self.fixed_length,
        }
