"""Vision-language models: ``--task image-text-to-text[-with-past]`` writes the vision encoder, the token
embedding and the decoder, each tagged 100% and checked against PyTorch; the pipeline and ``infer`` generate from
images and prompts through the model's own processor and chat template, with the token ids of transformers'
``generate``.

Families (tiny configs, random weights, the real processors built locally: ``tests/models/vlm.py``): LLaVA (a
plain projector) and Qwen2-VL (packed patches, ``image_grid_thw``, M-RoPE) run in the default suite; Idefics3
(image splitting) and Gemma 3 (bidirectional attention over image tokens) have a PyTorch smoke of their split
there and their export and generation in ``make test-slow``; PaliGemma (bidirectional attention over the prompt)
exports without a cache only (slow), its refusal with one is in the default suite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError, ExportError, ImageInputError, InputSpecError
from modelexport.export.api import export
from modelexport.export.config import ExportConfig
from modelexport.export.loading import load_model
from modelexport.export.vlm import build_vlm_inputs
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.inference import pipeline
from modelexport.inference.multimodal import POSITION_SCHEMES, synthetic_image
from modelexport.inspect.report import build_report_data
from modelexport.metadata.schema import KEY_GENERATION, KEY_TASK
from modelexport.metadata.store import read_metadata
from modelexport.onnxfile import read_manifest, resolve_model_path, sidecar_path_for
from modelexport.optimize import tag_coverage

FAST = ("llava", "qwen2_vl")
SLOW = ("idefics3", "gemma3")
ROLES = {"vision_encoder": "vision_encoder.onnx", "embed_tokens": "embed_tokens.onnx"}
MERGED = "decoder_model_merged.onnx"
PROMPTS = ["Describe the image.", "What is in this picture? Answer in one word."]
#: Images of the batch: sizes a photo could have, different so that padding and patch counts differ.
SIZES = [(50, 40), (90, 120)]


def _family_params(fast: tuple[str, ...], slow: tuple[str, ...]) -> list[Any]:
    return [*fast, *(pytest.param(f, marks=pytest.mark.slow) for f in slow)]


ALL = _family_params(FAST, SLOW)


def _io(path: Path) -> tuple[list[str], list[str]]:
    model = onnx.load(str(path), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def _producer_tags(path: Path) -> dict[str, str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        o: next(p.value for p in n.metadata_props if p.key == TAG_KEY)
        for n in model.graph.node
        for o in n.output
    }


def _reference_generate(src: Path, feeds: dict[str, np.ndarray], **options: Any) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(str(src)).eval()
    with torch.no_grad():
        out = model.generate(**{k: torch.from_numpy(v) for k, v in feeds.items()}, do_sample=False, **options)
    return out.numpy()


# ------------------------------------------------------------------------------------------------ export
@pytest.mark.must
@pytest.mark.parametrize("family", ALL)
def test_three_graphs_tagged_checked_and_listed(vlm_packages: Any, family: str) -> None:
    out, result = vlm_packages.export(family)
    files = {**ROLES, "decoder": MERGED}
    assert set(result.components) == set(files.values())
    for name, graph in result.components.items():
        assert graph.coverage["coverage_pct"] == 100.0, name
        assert graph.parity["passed"] and graph.parity["checks"], name  # other images / an empty past too
        assert all(c["passed"] for c in graph.parity["checks"].values()), name
        assert json.loads(sidecar_path_for(out / name).read_text())["nodes"], name
        assert tag_coverage(onnx.load(str(out / name)))["coverage_pct"] == 100.0
    manifest = read_manifest(out)
    assert manifest["components"] == files
    assert {"chat_template.jinja", "processor_config.json", "preprocessor_config.json"} <= set(
        manifest["files"]
    )
    assert resolve_model_path(out) == out / "vision_encoder.onnx"  # the package's entry runs first
    inputs, outputs = _io(out / MERGED)
    assert inputs[:2] == ["inputs_embeds", "attention_mask"] and "past_key_values.1.value" in inputs
    assert outputs == ["logits", *(f"present.{i}.{k}" for i in range(2) for k in ("key", "value"))]
    assert _io(out / "embed_tokens.onnx") == (["input_ids"], ["inputs_embeds"])
    assert _io(out / "vision_encoder.onnx")[1] == ["image_features"]
    meta = read_metadata(out / "vision_encoder.onnx")
    assert meta[KEY_TASK] == "image-text-to-text"
    record = meta[KEY_GENERATION]
    assert record["components"] == files and record["cache"]["layers"] == 2 and record["with_past"]


def test_qwen2_vl_takes_packed_patches_and_mrope_positions(vlm_packages: Any) -> None:
    out, _ = vlm_packages.export("qwen2_vl")
    vision, _ = _io(out / "vision_encoder.onnx")
    assert vision == ["pixel_values", "image_grid_thw", "vision_position_ids", "cu_seqlens"]
    model = onnx.load(str(out / "vision_encoder.onnx"), load_external_data=False)
    patches = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert patches.dim_param, "the patch count is dynamic: any image size the processor accepts"
    record = read_metadata(out / MERGED)[KEY_GENERATION]
    assert record["positions"] == {"scheme": "mrope", "params": {"spatial_merge_size": 2, "text_row": True}}
    assert set(record["vision"]["precomputed"]) == {"vision_position_ids", "cu_seqlens"}
    pos = onnx.load(str(out / MERGED), load_external_data=False).graph.input[2]
    assert pos.name == "position_ids" and pos.type.tensor_type.shape.dim[0].dim_value == 4


def test_tags_name_the_modules_that_compute_each_output(vlm_packages: Any) -> None:
    out, _ = vlm_packages.export("llava")
    vision = set(_producer_tags(out / "vision_encoder.onnx").values())
    assert any(t.endswith("/LlavaModel/LlavaMultiModalProjector") for t in vision)
    assert any("/LlavaModel/CLIPVisionModel/CLIPEncoder/CLIPEncoderLayer.1/" in t for t in vision)
    assert "/Embedding" in _producer_tags(out / "embed_tokens.onnx")["inputs_embeds"]
    presents = _producer_tags(out / MERGED)
    assert "LlamaDecoderLayer.1/LlamaAttention" in presents["present.1.key"]
    assert presents["logits"].startswith("/LlavaForConditionalGeneration")


# -------------------------------------------------------------------------------------------- generation
@pytest.fixture(scope="module")
def generators(vlm_packages: Any) -> dict[str, Any]:
    return {}


def _gen(
    vlm_packages: Any, generators: dict[str, Any], family: str
) -> tuple[Any, Path, dict[str, np.ndarray]]:
    """(pipeline, source folder, the processor's feeds for PROMPTS about images of SIZES)."""
    if family not in generators:
        out, _ = vlm_packages.export(family)
        pipe = pipeline(model=out)
        images = [synthetic_image(h, w, seed=i + 3) for i, (h, w) in enumerate(SIZES)]
        generators[family] = (pipe, vlm_packages.source(family), pipe.processor(texts=PROMPTS, images=images))
    return generators[family]


@pytest.mark.must
@pytest.mark.parametrize("family", ALL)
@pytest.mark.parametrize(
    "options",
    [{}, {"num_beams": 3}, {"repetition_penalty": 1.3}],
    ids=["greedy", "beam-search", "repetition-penalty"],
)
def test_token_ids_equal_transformers_generate(
    vlm_packages: Any, generators: dict[str, Any], family: str, options: dict[str, Any]
) -> None:
    pipe, src, feeds = _gen(vlm_packages, generators, family)
    assert (feeds["attention_mask"] == 0).any(), "the batch is padded"
    ours = pipe.generate_from(feeds, pipe.settings(max_new_tokens=10, **options))
    np.testing.assert_array_equal(ours, _reference_generate(src, feeds, max_new_tokens=10, **options))
    assert len(set(ours[:, feeds["input_ids"].shape[1] :].ravel().tolist())) > 3, "tokens must vary"


def test_images_of_any_size_the_processor_accepts(vlm_packages: Any, generators: dict[str, Any]) -> None:
    pipe, src, _ = _gen(vlm_packages, generators, "qwen2_vl")
    patches = set()
    for i, (h, w) in enumerate([(30, 200), (224, 224), (130, 61)]):
        feeds = pipe.processor(texts=PROMPTS[:1], images=[synthetic_image(h, w, seed=i)])
        patches.add(int(feeds["pixel_values"].shape[0]))
        ours = pipe.generate_from(feeds, pipe.settings(max_new_tokens=6))
        np.testing.assert_array_equal(ours, _reference_generate(src, feeds, max_new_tokens=6))
    assert len(patches) == 3, "each size gives another patch count"


def test_mrope_positions_equal_get_rope_index(vlm_packages: Any, generators: dict[str, Any]) -> None:
    import torch
    import transformers

    pipe, src, feeds = _gen(vlm_packages, generators, "qwen2_vl")
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(src)).eval()
    theirs, _ = model.model.get_rope_index(
        **{k: torch.from_numpy(v) for k, v in feeds.items() if k != "pixel_values"}
    )
    params = {"spatial_merge_size": 2, "text_row": False}
    ours = POSITION_SCHEMES["mrope"].compute(feeds["input_ids"], feeds["attention_mask"], feeds, params)
    real = feeds["attention_mask"].astype(bool)
    np.testing.assert_array_equal(ours[:, real], theirs.numpy()[:, real])


def test_pipeline_output_and_inputs(vlm_packages: Any, generators: dict[str, Any]) -> None:
    pipe, _, _ = _gen(vlm_packages, generators, "llava")
    image = synthetic_image(64, 48, seed=1)
    one = pipe({"images": image, "text": PROMPTS[0]}, max_new_tokens=4)
    assert set(one[0]) == {"input_text", "generated_text"} and one[0]["generated_text"]
    assert one[0]["input_text"].startswith("user: <image>") and one[0]["input_text"].endswith("assistant:")
    other = synthetic_image(30, 90, seed=2)
    both = pipe(images=[image, other], text=[PROMPTS[0], PROMPTS[1]], max_new_tokens=4, batch_size=2)
    assert len(both) == 2 and both[0] == one  # in a batch of two (padded) the same answer as alone
    assert pipe.describe()["processor"]["chat_template"]


def test_cli_infer_generates_from_an_image_and_a_prompt(
    vlm_packages: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = vlm_packages.export("llava")
    photo = tmp_path / "photo.png"
    synthetic_image(80, 60, seed=5).save(photo)
    args = [
        "infer",
        str(out),
        "--image",
        str(photo),
        "--text",
        "Describe the image.",
        "--max-new-tokens",
        "5",
    ]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["task"] == "image-text-to-text" and doc["predictions"][0][0]["generated_text"]
    assert main(args) == 0
    streamed = capsys.readouterr().out
    assert "photo.png: Describe the image. -> " in streamed, "one prompt streams its tokens after its label"
    assert streamed.split("photo.png: Describe the image. -> ", 1)[1].split("\n", 1)[0].strip()
    assert main(["infer", str(out), "--text", "no image"]) == 1
    assert "give --image and --text" in capsys.readouterr().err


def test_an_image_the_model_cannot_take_fails_before_loading(
    vlm_packages: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import modelexport.cli.infer as infer_cli

    out, _ = vlm_packages.export("qwen2_vl")
    thin, broken = tmp_path / "thin.png", tmp_path / "broken.png"
    synthetic_image(2, 600).save(thin)  # an aspect ratio of 300: Qwen2-VL's processor takes at most 200
    broken.write_text("not an image")
    monkeypatch.setattr(infer_cli, "pipeline", lambda *a, **k: pytest.fail("graphs loaded before the check"))
    for path, message in ((thin, "aspect ratio must be smaller than 200"), (broken, "not an image")):
        assert main(["infer", str(out), "--image", str(path), "--text", "Describe it."]) == 1
        assert message in capsys.readouterr().err
    with pytest.raises(ImageInputError, match="600 x 2 pixels"):
        pipeline(model=out)({"images": str(thin), "text": "Describe it."})


def test_refusals_come_before_any_output(vlm_packages: Any, minilm_dir: Path, tmp_path: Path) -> None:
    from tests.generation.conftest import save_causal_lm

    src = vlm_packages.source("llava")
    task = "image-text-to-text-with-past"
    with pytest.raises(ConfigError, match="dynamo"):
        export(src, tmp_path / "a", task=task, exporter="torchscript")
    with pytest.raises(ConfigError, match="static is refused"):
        export(src, tmp_path / "a", task=task, quantize="static")
    with pytest.raises(ConfigError, match="not supported"):
        export(src, tmp_path / "a", task=task, with_report=True)
    with pytest.raises(ConfigError, match="dtype float16 is not supported"):
        export(src, tmp_path / "a", task=task, dtype="fp16")
    with pytest.raises(ConfigError, match="must be a folder"):
        export(src, tmp_path / "a.onnx", task=task)
    llama = save_causal_lm("llama", minilm_dir, tmp_path / "llama")
    with pytest.raises(ConfigError, match="needs a vision-language model") as info:
        export(llama, tmp_path / "b", task=task)
    assert "text-generation-with-past" in str(info.value.hint)
    with pytest.raises(
        InputSpecError
    ) as plain:  # no task: one graph of the whole model cannot take the images
        export(vlm_packages.source("qwen2_vl"), tmp_path / "c")
    assert "--task image-text-to-text-with-past" in str(plain.value.hint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


# ------------------------------------------------------------------------ no cache, -O2 and int8 packages
@pytest.mark.parametrize(
    "family", _family_params(("llava",), ("qwen2_vl", "idefics3", "gemma3", "paligemma"))
)
def test_without_a_cache_the_decoder_reruns_the_sequence(vlm_packages: Any, family: str) -> None:
    out, result = vlm_packages.export(family, task="image-text-to-text")
    assert read_manifest(out)["components"]["decoder"] == "decoder_model.onnx"
    assert all(g.coverage["coverage_pct"] == 100.0 and g.parity["passed"] for g in result.components.values())
    assert not [n for n in _io(out / "decoder_model.onnx")[0] if n.startswith("past_key_values")]
    pipe = pipeline(model=out)
    images = [synthetic_image(h, w, seed=i + 3) for i, (h, w) in enumerate(SIZES)]
    feeds = pipe.processor(texts=PROMPTS, images=images)
    ours = pipe.generate_from(feeds, pipe.settings(max_new_tokens=6, num_beams=2))
    ref = _reference_generate(vlm_packages.source(family), feeds, max_new_tokens=6, num_beams=2)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.must
def test_quantize_and_optimize_a_package_keep_tags_and_generation(
    vlm_packages: Any, generators: dict[str, Any], tmp_path: Path
) -> None:
    out, _ = vlm_packages.export("llava")
    fp32, _, feeds = _gen(vlm_packages, generators, "llava")
    assert main(["quantize", str(out), "-o", str(tmp_path / "int8") + "/"]) == 0
    assert main(["optimize", str(out), "-o", str(tmp_path / "o2") + "/", "-O2"]) == 0
    settings = fp32.settings(max_new_tokens=8)
    want = fp32.generate_from(feeds, settings)
    for name in ("int8", "o2"):
        folder = tmp_path / name
        assert read_manifest(folder)["components"] == {**ROLES, "decoder": MERGED}
        for graph in (*ROLES.values(), MERGED):
            assert tag_coverage(onnx.load(str(folder / graph)))["coverage_pct"] == 100.0, (name, graph)
        got = pipeline(model=folder).generate_from(feeds, settings)
        if name == "o2":
            np.testing.assert_array_equal(got, want)
        else:  # int8 weights: another model, which still generates from the image and prompt
            assert got.shape[0] == want.shape[0] and got.shape[1] > feeds["input_ids"].shape[1]


@pytest.mark.slow
def test_export_optimize_and_quantize_write_every_graph(
    vlm_packages: Any, generators: dict[str, Any]
) -> None:
    out, result = vlm_packages.export("qwen2_vl", optimize="O2", quantize="dynamic")
    manifest = read_manifest(out)
    assert manifest["deployed_model"] == "vision_encoder_O2.onnx"
    assert set(manifest["variants"]) == {"O2", "dynamic"}
    for variant in manifest["variants"].values():
        for graph in variant.values():
            assert tag_coverage(onnx.load(str(out / graph)))["coverage_pct"] == 100.0, graph
    assert all(c["passed"] for c in result.parity["files"].values())
    fp32, src, feeds = _gen(vlm_packages, generators, "qwen2_vl")
    o2 = pipeline(model=out)
    assert o2.model_path.name == "vision_encoder_O2.onnx"
    settings = o2.settings(max_new_tokens=8)
    np.testing.assert_array_equal(o2.generate_from(feeds, settings), fp32.generate_from(feeds, settings))


def test_profile_and_report_show_every_graph(
    vlm_packages: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = vlm_packages.export("qwen2_vl")  # an image grid and its patches: inputs no generator can make
    assert main(["profile", str(out), "--runs", "1", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["components"]) == ["vision_encoder", "embed_tokens", "decoder"]
    assert doc["inputs"] == "the package pipeline's inputs"
    assert all(r["kernel_us"] > 0 and r["modules"] for r in doc["components"].values())
    assert any("Qwen2VLDecoderLayer.1" in m["tag"] for m in doc["components"]["decoder"]["modules"])
    assert main(["report", str(out), "-o", str(tmp_path / "report.html"), "--profile", "--runs", "1"]) == 0
    data = build_report_data(str(out))
    assert [c["role"] for c in data["components"]] == ["vision_encoder", "embed_tokens", "decoder"]
    assert all(c["tagged_pct"] == 100.0 and c["nodes"] for c in data["components"])
    page = (tmp_path / "report.html").read_text()
    assert "decoder_model_merged.onnx" in page and "wall_us" in page


@pytest.mark.smoke
def test_a_first_step_that_differs_with_an_empty_cache_is_refused(vlm_packages: Any, tmp_path: Path) -> None:
    """PaliGemma attends bidirectionally over its prompt only when no cache exists yet: a decoder graph with a
    cache input (empty on the first step) cannot reproduce that, measured before any capture; without a cache it
    exports and generates like transformers (slow test above)."""
    with pytest.raises(ExportError, match="first step with an empty past") as info:
        export(vlm_packages.source("paligemma"), tmp_path / "out", task="image-text-to-text-with-past")
    assert "--task image-text-to-text" in str(info.value.hint)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------- fast family smoke
@pytest.mark.smoke
@pytest.mark.parametrize("family", SLOW)
def test_split_reproduces_the_whole_model(vlm_packages: Any, family: str) -> None:
    """The slow families' design, checked in PyTorch in seconds: the example inputs from the processor, the
    precomputed vision inputs, generate()'s positions and the three steps reproducing the whole model's logits
    (what the export checks before any capture), and the graphs it would write."""
    graphs = build_vlm_inputs(
        load_model(str(vlm_packages.source(family))), ExportConfig(task="image-text-to-text")
    )
    assert [g.file for g in graphs] == ["vision_encoder.onnx", "embed_tokens.onnx", "decoder_model.onnx"]
    assert graphs[0].checks and graphs[2].checks
    if family == "gemma3":
        assert "token_type_ids" in graphs[2].names  # bidirectional attention over each image's tokens
    if family == "idefics3":
        dynamic = graphs[0].dynamic_axes(False) or {}
        assert 1 in dynamic["pixel_values"], "the crop count is dynamic"
