"""Processors: shapes from the graph (fixed: pad/crop; dynamic: natural), equal to transformers' processors."""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from modelexport._transformers import processor_type_name
from modelexport.errors import InferenceError, MetadataError
from modelexport.inference import (
    ONNXAutoProcessor,
    ONNXFeatureExtractor,
    ONNXImageProcessor,
    ONNXProcessor,
    ONNXTokenizer,
)
from modelexport.inference.graph import GraphInput
from modelexport.inference.processors import PROCESSORS, ProcessorSources
from tests.inference.tiny_tasks import CNN_PROCESSOR

RNG = np.random.RandomState(0)


def _rgb(h: int = 40, w: int = 50) -> np.ndarray:
    return (RNG.rand(h, w, 3) * 255).astype(np.uint8)


@pytest.mark.must
@pytest.mark.parametrize(
    ("name", "cls"),
    [("seq_cls", ONNXTokenizer), ("image_cls", ONNXImageProcessor), ("audio_cls", ONNXFeatureExtractor)],
)
def test_auto_processor_picks_the_kind(task_export: Any, name: str, cls: type) -> None:
    proc = ONNXAutoProcessor.from_model(task_export(name).onnx_path)
    assert type(proc) is cls
    assert proc.describe()["inputs"]


@pytest.mark.must
def test_tokenizer_dynamic_pads_to_longest(task_export: Any) -> None:
    from transformers import AutoTokenizer

    folder = task_export("seq_cls").output_dir
    proc = ONNXAutoProcessor.from_model(folder)
    texts = ["hello world", "the big river is in the city of london"]
    feeds = proc(texts=texts)
    ref = AutoTokenizer.from_pretrained(str(folder))(texts, padding=True, return_tensors="np")
    assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids"}
    for key, value in feeds.items():
        np.testing.assert_array_equal(value, ref[key])
        assert value.dtype == np.int64


@pytest.mark.must
def test_tokenizer_fixed_length_pads_and_truncates(task_export: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(task_export("seq_cls").output_dir))
    inputs = [GraphInput("input_ids", (None, 8), "int32"), GraphInput("attention_mask", (None, 8), "int32")]
    feeds = ONNXTokenizer(tok, inputs)(texts=["hi", "the big river is in the city of london and paris"])
    assert feeds["input_ids"].shape == (2, 8) and feeds["input_ids"].dtype == np.int32
    assert feeds["attention_mask"][0].sum() < 8 and feeds["attention_mask"][1].sum() == 8
    assert "token_type_ids" not in feeds  # only what the graph takes


@pytest.mark.must
def test_image_processor_equals_transformers_vit(task_export: Any) -> None:
    from transformers import ViTImageProcessor

    folder = task_export("image_cls").output_dir
    images = [_rgb(), _rgb(20, 33)]
    ours = ONNXAutoProcessor.from_model(folder)(images=images)["pixel_values"]
    ref = ViTImageProcessor.from_pretrained(str(folder))(images=images, return_tensors="np")["pixel_values"]
    assert ours.shape == ref.shape == (2, 3, 32, 32)
    assert np.abs(ours - ref).max() < 1e-5


_CLIP_STATS = {
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
#: name -> (transformers class, settings): fixed size, shortest edge + center crop, crop_pct.
IMAGE_CONFIGS = {
    "vit": ("ViTImageProcessor", {"size": {"height": 224, "width": 224}}),
    "clip": (
        "CLIPImageProcessor",
        {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}, **_CLIP_STATS},
    ),
    "convnext": ("ConvNextImageProcessor", {"size": {"shortest_edge": 224}, "crop_pct": 0.875}),
}
#: Odd sizes; short sides 55, 71 (CLIP) and 49 (ConvNeXt) are where truncating ``h * (edge / h)``
#: gives 223 / 255 instead of transformers' 224 / 256.
ODD_SIZES = [(37, 53), (55, 83), (142, 71), (49, 67), (301, 199), (500, 333)]


@pytest.mark.must
@pytest.mark.parametrize("name", sorted(IMAGE_CONFIGS))
@pytest.mark.parametrize("graph_hw", [(224, 224), (None, None)], ids=["fixed", "dynamic"])
def test_image_preprocessing_equals_transformers(
    name: str, graph_hw: tuple[int | None, int | None], tmp_path: Path
) -> None:
    """The folder's preprocessor_config.json, read as AutoImageProcessor reads it: same pixels on odd sizes."""
    import transformers

    cls_name, settings = IMAGE_CONFIGS[name]
    getattr(transformers, cls_name)(**settings).save_pretrained(str(tmp_path))
    ref_proc = transformers.AutoImageProcessor.from_pretrained(str(tmp_path), use_fast=False)
    images = [Image.fromarray(_rgb(h, w)) for h, w in ODD_SIZES]
    ref = ref_proc(images=images, return_tensors="np")["pixel_values"]
    sources = ProcessorSources(tmp_path, [GraphInput("pixel_values", (None, 3, *graph_hw))], {}, {})
    proc = ONNXAutoProcessor.from_sources(sources)
    ours = proc(images=images)["pixel_values"]
    assert proc.describe()["transformers_class"] == cls_name and proc.describe()["numpy_pipeline"]
    assert ours.shape == ref.shape == (len(ODD_SIZES), 3, 224, 224)
    assert np.abs(ours - ref).max() <= 1e-5


@pytest.mark.sanity
@pytest.mark.parametrize("name", sorted(IMAGE_CONFIGS))
def test_fixed_graph_size_overrides_the_config_size(name: str) -> None:
    """A graph fixed to 96 x 96 gets 96 x 96 whatever the config says; the config's kind of resize is kept."""
    import transformers

    cls_name, settings = IMAGE_CONFIGS[name]
    cfg = getattr(transformers, cls_name)(**settings).to_dict()
    proc = ONNXImageProcessor([GraphInput("pixel_values", (None, 3, 96, 96))], cfg)
    images = [_rgb(h, w) for h, w in ODD_SIZES]
    assert proc(images=images)["pixel_values"].shape == (len(ODD_SIZES), 3, 96, 96)
    if "shortest_edge" in settings["size"]:
        assert proc.processor.to_dict()["size"] == {
            "shortest_edge": 96
        }  # aspect-keeping resize (+ crop) kept
    # transformers' own class with the fitted settings gives the same pixels
    ref = getattr(transformers, cls_name).from_dict(proc.processor.to_dict())(
        images=images, return_tensors="np"
    )
    assert np.abs(proc(images=images)["pixel_values"] - ref["pixel_values"]).max() <= 1e-5


@pytest.mark.must
def test_one_channel_graph_gets_grayscale_at_the_fixed_size(tmp_path: Path) -> None:
    proc = ONNXImageProcessor([GraphInput("x", (None, 1, 8, 8))], CNN_PROCESSOR)
    rgb = _rgb(20, 24)
    path = tmp_path / "digit.png"
    Image.fromarray(rgb).save(path)
    gray = np.asarray(Image.fromarray(rgb).convert("L"))
    forms = [Image.fromarray(rgb), str(path), rgb, gray, gray[:, :, None]]
    batch = proc(images=forms)["x"]
    assert batch.shape == (5, 1, 8, 8) and batch.dtype == np.float32
    expected = (np.asarray(Image.fromarray(gray).resize((8, 8), Image.BILINEAR)) / 255 - 0.5) / 0.5
    for row in batch:
        assert np.abs(row[0] - expected).max() < 1e-5


@pytest.mark.sanity
def test_dynamic_image_size_keeps_natural_size_and_pads() -> None:
    proc = ONNXImageProcessor([GraphInput("pixel_values", (None, 3, None, None))], {"do_resize": False})
    out = proc(images=[_rgb(10, 12), _rgb(14, 9)])["pixel_values"]
    assert out.shape == (2, 3, 14, 12)
    assert np.all(out[0, :, 10:, :] == 0)


@pytest.mark.must
def test_a_graph_with_dynamic_height_width_keeps_the_processors_own_size(task_export: Any) -> None:
    """The tiny detector (a CNN backbone) exports with dynamic height/width: every image is resized as its
    preprocessor_config.json says (64 x 64), as transformers does, not to the export's example size."""
    from transformers import DetrImageProcessor

    folder = task_export("object_det").output_dir
    proc = ONNXAutoProcessor.from_model(folder)
    assert (
        proc.describe()["inputs"][0]["shape"] == [None, 3, None, None] and proc.describe()["fixed_hw"] is None
    )
    images = [_rgb(48, 80), _rgb(30, 30)]
    ours = proc(images=images)["pixel_values"]
    ref = DetrImageProcessor.from_pretrained(str(folder))(images=images, return_tensors="np")["pixel_values"]
    assert ours.shape == ref.shape == (2, 3, 64, 64)
    assert np.abs(ours - ref).max() <= 1e-5


@pytest.mark.sanity
@pytest.mark.parametrize("bad", [np.zeros((2, 3, 4, 5)), np.zeros((4, 4, 2)), "missing.png"])
def test_bad_images_are_inference_errors(bad: Any) -> None:
    proc = ONNXImageProcessor([GraphInput("x", (None, 1, 8, 8))], CNN_PROCESSOR)
    with pytest.raises(InferenceError):
        proc(images=[bad])


def _write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())


@pytest.mark.must
def test_feature_extractor_equals_transformers_and_reads_wav(task_export: Any, tmp_path: Path) -> None:
    from transformers import Wav2Vec2FeatureExtractor

    folder = task_export("audio_cls").output_dir
    proc = ONNXAutoProcessor.from_model(folder)
    waves = [RNG.randn(4000).astype(np.float32) * 0.1, RNG.randn(2500).astype(np.float32) * 0.1]
    ours = proc(audio=waves)["input_values"]
    ref = Wav2Vec2FeatureExtractor.from_pretrained(str(folder))(
        waves, sampling_rate=16000, padding=True, return_tensors="np"
    )
    assert ours.shape == (2, 4000)
    assert np.abs(ours - ref["input_values"]).max() < 1e-4
    _write_wav(tmp_path / "a.wav", waves[0], 16000)
    _write_wav(tmp_path / "b.wav", waves[0], 8000)
    from_file = proc(audio=[str(tmp_path / "a.wav")])["input_values"]
    assert np.abs(from_file - ours[:1]).max() < 1e-3
    assert proc(audio=[str(tmp_path / "b.wav")])["input_values"].shape == (1, 8000)  # resampled to 16 kHz


@pytest.mark.must
@pytest.mark.parametrize("with_mask", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("length", [None, 3000], ids=["dynamic", "fixed"])
def test_raw_audio_equals_wav2vec2_feature_extractor(with_mask: bool, length: int | None) -> None:
    """input_values (and the attention mask when the config returns one) as transformers computes them."""
    from transformers import Wav2Vec2FeatureExtractor

    ref_fe = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, do_normalize=True, return_attention_mask=with_mask
    )
    inputs = [GraphInput("input_values", (None, length))]
    inputs += [GraphInput("attention_mask", (None, length), "int64")] if with_mask else []
    proc = ONNXFeatureExtractor(inputs, ref_fe.to_dict())
    waves = [RNG.randn(n).astype(np.float32) * 0.1 + 0.05 for n in (4000, 2500, 1200)]
    padding = (
        {"padding": "max_length", "max_length": length, "truncation": True} if length else {"padding": True}
    )
    ref = ref_fe(waves, sampling_rate=16000, return_tensors="np", **padding)
    feeds = proc(audio=waves)
    assert set(feeds) == {i.name for i in inputs}
    assert feeds["input_values"].shape == ref["input_values"].shape == (3, length or 4000)
    assert np.abs(feeds["input_values"] - ref["input_values"]).max() <= 1e-5
    if with_mask:
        np.testing.assert_array_equal(feeds["attention_mask"], ref["attention_mask"])


@pytest.mark.regression
def test_audio_defaults_are_the_extractor_defaults() -> None:
    """A config that leaves return_attention_mask out normalises as transformers does (whole padded row)."""
    from transformers import Wav2Vec2FeatureExtractor

    proc = ONNXFeatureExtractor([GraphInput("input_values", (None, None))], {"sampling_rate": 16000})
    waves = [RNG.randn(n).astype(np.float32) * 0.1 + 0.05 for n in (3000, 1000)]
    ref = Wav2Vec2FeatureExtractor()(waves, sampling_rate=16000, padding=True, return_tensors="np")
    assert type(proc.extractor) is Wav2Vec2FeatureExtractor
    assert np.abs(proc(audio=waves)["input_values"] - ref["input_values"]).max() <= 1e-5


@pytest.mark.sanity
def test_multimodal_processor(task_export: Any) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(task_export("seq_cls").output_dir))
    inputs = [GraphInput("input_ids", (None, None), "int64"), GraphInput("pixel_values", (None, 3, 8, 8))]
    proc = ONNXAutoProcessor.from_sources(
        ProcessorSources(None, inputs, {"size": 8, "processor_kinds": ["image_processor"]}, {}, tokenizer=tok)
    )
    assert isinstance(proc, ONNXProcessor)
    feeds = proc(texts=["hello world"], images=[_rgb()])
    assert feeds["input_ids"].shape[0] == 1 and feeds["pixel_values"].shape == (1, 3, 8, 8)


@pytest.mark.sanity
def test_text_model_without_tokenizer_files_is_a_clear_error(task_export: Any, tmp_path: Path) -> None:
    import shutil

    shutil.copy(task_export("seq_cls").onnx_path, tmp_path / "model.onnx")
    with pytest.raises(MetadataError, match="no tokenizer files"):
        ONNXAutoProcessor.from_model(tmp_path / "model.onnx")


@pytest.mark.must
def test_every_registered_processor_kind_is_tested() -> None:
    assert set(PROCESSORS) == {"image-text", "multimodal", "text", "image", "audio"}


@pytest.mark.regression
def test_pipeline_engineer_cnn_config_form() -> None:
    """The image classifier of `modelexport pipeline` embeds this form (do_resize False, per-channel stats)."""
    mean, std = [0.2, 0.3, 0.4], [0.5, 0.6, 0.7]
    cfg = {
        "image_processor_type": "ViTImageProcessor",
        "do_resize": False,
        "size": {"height": 8, "width": 8},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": mean,
        "image_std": std,
        "num_channels": 3,
    }
    proc = ONNXImageProcessor([GraphInput("pixel_values", (None, 3, 8, 8))], cfg)
    images = [(RNG.rand(8, 8, 3) * 255).astype(np.uint8) for _ in range(3)]
    expected = ((np.stack(images) / 255.0 - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)
    assert np.abs(proc(images=images)["pixel_values"] - expected).max() < 1e-5


@pytest.mark.must
def test_plain_torch_export_writes_a_transformers_image_processor_config(cnn_export: Any) -> None:
    """The plain CNN's folder loads with AutoImageProcessor and gives our processor's pixel values."""
    from transformers import AutoImageProcessor

    folder = cnn_export.output_dir
    hf = AutoImageProcessor.from_pretrained(str(folder), use_fast=False)
    assert processor_type_name(type(hf).__name__) == "ViTImageProcessor"  # 5.x: ViTImageProcessorPil
    assert hf.size == {"height": 8, "width": 8} and list(hf.image_mean) == [0.5]
    images = [Image.fromarray(_rgb(h, w)).convert("L") for h, w in ODD_SIZES]
    ref = hf(images=[np.asarray(i)[:, :, None] for i in images], return_tensors="np")["pixel_values"]
    ours = ONNXAutoProcessor.from_model(folder)(images=images)
    assert ours["x"].shape == ref.shape == (len(ODD_SIZES), 1, 8, 8)
    assert np.abs(ours["x"] - ref).max() <= 1e-5


@pytest.mark.must
@pytest.mark.compat
def test_transformers_classes_on_a_package_of_the_other_major_version_warn(
    task_export: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Our own tokenizer and image paths behave the same under transformers 4 and 5: no warning. Where
    transformers' own class pre-processes (here a folder without tokenizer.json) and the package says it
    was exported under the other major version, a warning names the class and both versions."""
    import shutil

    from modelexport._transformers import major_version, transformers_version
    from modelexport.inference.processors.auto import warn_on_version_drift

    installed = transformers_version()
    other = "4.57.6" if major_version(installed) == 5 else "5.24.0"
    fast = ONNXAutoProcessor.from_model(task_export("seq_cls").output_dir)
    assert fast.transformers_classes == [] and warn_on_version_drift(fast, {"transformers": other}) is None
    folder = Path(shutil.copytree(task_export("seq_cls").output_dir, tmp_path / "pkg"))
    (folder / "tokenizer.json").unlink()  # transformers' own tokenizer class from vocab.txt
    slow = ONNXAutoProcessor.from_model(folder)
    assert slow.transformers_classes and warn_on_version_drift(slow, {"transformers": installed}) is None
    with caplog.at_level("WARNING", logger="modelexport.inference.processors.auto"):
        message = warn_on_version_drift(slow, {"transformers": other})
    assert message and other in message and installed in message and slow.transformers_classes[0] in message
    assert message in caplog.text
