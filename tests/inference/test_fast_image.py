"""The numpy + PIL image processors equal transformers' own classes, and serving images imports neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelexport.inference.processors.fast_image import FAST_IMAGE_RULES, FastImageProcessor

SRC = Path(__file__).resolve().parents[2] / "src"

#: transformers class -> settings (small sizes; every resize / crop rule of the covered classes).
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "vit": ("ViTImageProcessor", {"size": {"height": 32, "width": 24}}),
    "deit": (
        "DeiTImageProcessor",
        {"size": {"height": 40, "width": 40}, "crop_size": {"height": 32, "width": 30}},
    ),
    "beit": (
        "BeitImageProcessor",
        {"size": {"height": 40, "width": 48}, "crop_size": {"height": 32, "width": 32}},
    ),
    "clip": ("CLIPImageProcessor", {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}}),
    "bit": ("BitImageProcessor", {"size": {"shortest_edge": 40}, "crop_size": {"height": 36, "width": 36}}),
    "convnext": ("ConvNextImageProcessor", {"size": {"shortest_edge": 32}, "crop_pct": 0.875}),
    "convnext-384": ("ConvNextImageProcessor", {"size": {"shortest_edge": 384}}),
    "deit-nearest": (
        "DeiTImageProcessor",
        {"resample": 0, "image_mean": [0.2, 0.3, 0.4], "image_std": [0.9, 1.0, 1.1]},
    ),
    "vit-no-resize": ("ViTImageProcessor", {"do_resize": False, "do_normalize": False}),
}
_ARGS = {"return_tensors": None, "input_data_format": "channels_last"}


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    sizes = [(37, 53), (64, 48), (20, 20), (33, 81), (120, 31)]
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _pair(name: str) -> tuple[Any, FastImageProcessor]:
    import transformers

    cls_name, settings = CASES[name]
    slow = getattr(transformers, cls_name)(**settings)
    config = json.loads(slow.to_json_string())
    fast = FastImageProcessor.from_config(config, lambda c: getattr(transformers, cls_name).from_dict(c))
    assert fast is not None, name
    return slow, fast


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("data_format", ["channels_first", "channels_last"])
def test_fast_image_processor_equals_transformers(name: str, data_format: str) -> None:
    slow, fast = _pair(name)
    for image in _images():  # one at a time: a batch of different sizes is not stackable
        ours = fast([image], data_format=data_format, **_ARGS)["pixel_values"][0]
        ref = np.asarray(slow(images=[image], **_ARGS)["pixel_values"][0])  # channels first in every version
        ref = np.moveaxis(ref, 0, -1) if data_format == "channels_last" else ref
        assert ours.shape == ref.shape and ours.dtype == ref.dtype, (name, image.shape)
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-6, err_msg=f"{name} {image.shape}")
    assert fast._slow is None  # all of it done without transformers


def test_what_is_not_covered_goes_to_transformers() -> None:
    import transformers

    assert set(FAST_IMAGE_RULES) >= {CASES[n][0] for n in CASES}
    slow, fast = _pair("deit")
    small = _images()[2]  # 20 x 20 without resizing: the 32 x 30 crop pads, which transformers does
    for proc in (slow, fast):
        proc.do_resize = False
    fast.config["do_resize"] = False
    floats = small.astype(np.float32) / 255
    for image, kw in ((small, {}), (floats, {"do_rescale": False})):
        ref = slow(images=[image], data_format="channels_first", **_ARGS, **kw)["pixel_values"][0]
        ours = fast([image], data_format="channels_first", **_ARGS, **kw)["pixel_values"][0]
        np.testing.assert_allclose(ours, ref, atol=1e-6)
    assert fast._slow is not None
    other = json.loads(transformers.DetrImageProcessor().to_json_string())
    assert FastImageProcessor.from_config(other, lambda c: None) is None  # another class
    partial = {k: v for k, v in json.loads(slow.to_json_string()).items() if k != "resample"}
    assert FastImageProcessor.from_config(partial, lambda c: None) is None  # class defaults differ: no guess


def test_serving_an_image_model_imports_neither_torch_nor_transformers(
    task_export: Any, tmp_path: Path
) -> None:
    from PIL import Image

    folder = task_export("image_cls").output_dir
    image = tmp_path / "x.png"
    Image.fromarray(_images()[0]).save(image)
    heavy = "[m for m in ('torch', 'transformers') if m in sys.modules]"
    code = (
        "import json, sys\nimport modelexport\n"
        f"pipe = modelexport.pipeline(model={str(folder)!r})\nout = pipe({str(image)!r})\n"
        f"print(json.dumps([out[0]['label'], {heavy}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    label, loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [] and label
    import modelexport

    assert modelexport.pipeline(model=folder)(str(image))[0]["label"] == label  # in-process: the same answer
