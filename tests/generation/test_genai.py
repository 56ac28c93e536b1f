"""``genai_config.json``: a decoder package that onnxruntime-genai runs too (the tiny Llama and Qwen2, fp32
and int4).

The config must name exactly what the graph takes and returns, stay true after ``quantize`` (which writes the
graph under another name), and be absent where onnxruntime-genai cannot run the graph. The generation tests
run onnxruntime-genai itself on our package when it is importable: a benchmark-only package installed beside
modelexport (never one of its dependencies; see docs/development.md), skipped where it is not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.inference import pipeline
from modelexport.metadata.genai import GENAI_CONFIG_FILE, build_genai_config, retarget_genai_config
from modelexport.metadata.schema import KEY_GENERATION
from modelexport.metadata.store import read_metadata
from modelexport.onnxfile import PACKAGE_MANIFEST
from modelexport.optimize import WeightOnlyConfig, quantize

from .conftest import export_causal_lm

PROMPTS = ["hello world", "once upon a time there was"]
NEW = 10


@pytest.fixture(scope="module")
def packages(
    llama_with_past: Any, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """name -> (source folder, package folder, decoder file): fp32 exports and their int4 copies, Qwen2's
    quantized into a file of another name (the copied config must name it)."""
    root = tmp_path_factory.mktemp("genai")
    llama_src, llama, _ = llama_with_past
    qwen_src, qwen, _ = export_causal_lm("qwen2", minilm_dir, root)
    quantize(llama, root / "llama-int4", WeightOnlyConfig.preset("int4"))
    quantize(qwen, root / "qwen2-int4" / "decoder.onnx", WeightOnlyConfig.preset("int4"))
    return {
        "llama": (llama_src, llama, "model.onnx"),
        "llama-int4": (llama_src, root / "llama-int4", "model.onnx"),
        "qwen2": (qwen_src, qwen, "model.onnx"),
        "qwen2-int4": (qwen_src, root / "qwen2-int4", "decoder.onnx"),
    }


def _expand(name: str, layers: int) -> list[str]:
    return [name % i for i in range(layers)] if "%d" in name else [name]


@pytest.mark.must
@pytest.mark.compat
@pytest.mark.parametrize("name", ["llama", "llama-int4", "qwen2", "qwen2-int4"])
def test_config_names_exactly_what_the_graph_takes_and_returns(name: str, packages: dict[str, Any]) -> None:
    src, folder, file = packages[name]
    config = json.loads((folder / GENAI_CONFIG_FILE).read_text())
    model_cfg = json.loads((src / "config.json").read_text())
    section, decoder = config["model"], config["model"]["decoder"]
    assert section["type"] == "decoder" and decoder["filename"] == file
    graph = onnx.load(str(folder / file), load_external_data=False)
    layers = decoder["num_hidden_layers"]
    named_in = [n for v in decoder["inputs"].values() for n in _expand(v, layers)]
    named_out = [n for v in decoder["outputs"].values() for n in _expand(v, layers)]
    assert sorted(named_in) == sorted(i.name for i in graph.graph.input)  # onnxruntime-genai feeds every one
    assert sorted(named_out) == sorted(o.name for o in graph.graph.output)
    past = next(i for i in graph.graph.input if i.name == decoder["inputs"]["past_key_names"] % 0)
    assert past.type.tensor_type.shape.dim[3].dim_value == decoder["head_size"]
    assert past.type.tensor_type.shape.dim[1].dim_value == decoder["num_key_value_heads"]
    assert layers == model_cfg["num_hidden_layers"] and decoder["head_size"] == 16
    assert decoder["num_key_value_heads"] == model_cfg["num_key_value_heads"]
    assert section["context_length"] == model_cfg["max_position_embeddings"]
    assert section["vocab_size"] == model_cfg["vocab_size"]
    assert section["eos_token_id"] == [model_cfg["eos_token_id"]]
    assert (section["pad_token_id"], section["bos_token_id"]) == (
        model_cfg["pad_token_id"],
        model_cfg["bos_token_id"],
    )
    assert config["search"]["past_present_share_buffer"] is False  # the graph concatenates past and new
    assert GENAI_CONFIG_FILE in json.loads((folder / PACKAGE_MANIFEST).read_text())["files"]


def _genai_greedy(folder: Path, prompts: list[list[int]], new: int) -> list[list[int]]:
    """onnxruntime-genai's greedy continuations of a batch of token-id prompts (it right-pads them itself; a
    row that ends keeps its eos out of the sequence and gets pads while the others go on)."""
    og = pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai (benchmark-only) is not installed"
    )
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    width = max(map(len, prompts))
    params.set_search_options(max_length=width + new, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    pad = _special(folder)[1]
    generator.append_tokens(np.array([p + [pad] * (width - len(p)) for p in prompts], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    rows = [[int(t) for t in generator.get_sequence(i)] for i in range(len(prompts))]
    assert all(
        row[: len(p)] == p and set(row[len(p) : width]) <= {pad} for p, row in zip(prompts, rows, strict=True)
    )
    return [row[width:] for row in rows]


def _special(folder: Path) -> tuple[int, int]:
    """(eos, pad) as the package's genai_config.json gives them."""
    section = json.loads((folder / GENAI_CONFIG_FILE).read_text())["model"]
    return section["eos_token_id"][0], section["pad_token_id"]


def _assert_continues(folder: Path, theirs: list[int], reference: list[int], prompt: list[int]) -> None:
    """onnxruntime-genai's continuation is ``reference``'s (prompt + new tokens, eos included as transformers
    and our pipeline give it) up to its eos; after an eos only pads."""
    eos, pad = _special(folder)
    assert reference[: len(prompt)] == prompt
    new = reference[len(prompt) :]
    new = new[: new.index(eos)] if eos in new else new
    assert theirs[: len(new)] == new and set(theirs[len(new) :]) <= {pad}


def _transformers_greedy(src: Path, prompt: list[int], new: int) -> list[int]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(src)).eval()
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False)[0].tolist()


def _ours(folder: Path, file: str, prompt: list[int], new: int) -> list[int]:
    pipe = pipeline("text-generation", model=folder / file)
    ids = np.array([prompt], dtype=np.int64)
    return pipe.generate(ids, np.ones_like(ids), pipe.settings(max_new_tokens=new))[0].tolist()


def _prompts(folder: Path) -> list[list[int]]:
    ids, mask = pipeline("text-generation", model=folder).encode(PROMPTS)
    return [row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)]


@pytest.mark.integration
@pytest.mark.parametrize("name", ["llama", "llama-int4", "qwen2", "qwen2-int4"])
def test_onnxruntime_genai_generates_our_tokens(name: str, packages: dict[str, Any]) -> None:
    """Greedy, one prompt at a time: onnxruntime-genai on our package gives our pipeline's tokens, and on fp32
    transformers' own (int4 weights change the tokens of these near-tied random models, for both runtimes)."""
    src, folder, file = packages[name]
    for prompt in _prompts(folder):
        (theirs,) = _genai_greedy(folder, [prompt], NEW)
        assert len(theirs) == NEW  # these prompts meet no eos: every token compared
        _assert_continues(folder, theirs, _ours(folder, file, prompt, NEW), prompt)
        if not name.endswith("int4"):
            _assert_continues(folder, theirs, _transformers_greedy(src, prompt, NEW), prompt)


@pytest.mark.integration
def test_onnxruntime_genai_batch_pads_on_the_right_and_generates_each_row_like_transformers(
    packages: dict[str, Any],
) -> None:
    """onnxruntime-genai right-pads a batch and masks the pads (0s inside the mask, positions from the mask):
    the graph's mask handling gives each row the tokens it gets alone."""
    src, folder, _ = packages["llama"]
    prompts = _prompts(folder)
    assert len(prompts[0]) != len(prompts[1])
    rows = _genai_greedy(folder, prompts, NEW)
    assert all(len(row) == NEW for row in rows)
    for prompt, row in zip(prompts, rows, strict=True):
        _assert_continues(folder, row, _transformers_greedy(src, prompt, NEW), prompt)


def _record(folder: Path) -> dict[str, Any]:
    return read_metadata(folder / "model.onnx")[KEY_GENERATION]


def test_graphs_onnxruntime_genai_cannot_run_get_no_config(packages: dict[str, Any]) -> None:
    import transformers

    src, folder, _ = packages["llama"]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    config = transformers.AutoConfig.from_pretrained(str(src))
    record = _record(folder)
    assert build_genai_config(graph, record, "model.onnx", config, None).config is not None
    other_heads = {**record, "cache": {**record["cache"], "value_head_dim": 8}}
    assert "head sizes" in build_genai_config(graph, other_heads, "model.onnx", config, None).reason
    extra = onnx.ModelProto()
    extra.CopyFrom(graph)
    extra.graph.input.append(
        onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, [1, 1])
    )
    built = build_genai_config(extra, record, "model.onnx", config, None)
    assert built.config is None and "token_type_ids" in built.reason
    no_cache = {**record, "cache_inputs": [], "cache_outputs": []}
    assert (
        "no per-layer key/value cache"
        in build_genai_config(graph, no_cache, "model.onnx", config, None).reason
    )
    bare = transformers.PretrainedConfig()  # a model config without a context length
    assert "max_position_embeddings" in build_genai_config(graph, record, "model.onnx", bare, None).reason


def test_quantize_drops_a_copied_config_the_graph_no_longer_fits(
    packages: dict[str, Any], tmp_path: Path
) -> None:
    """A config naming a layer the graph lacks is not carried into the quantized package (nor listed)."""
    _, folder, _ = packages["llama"]
    copy = shutil.copytree(folder, tmp_path / "edited")
    path = copy / GENAI_CONFIG_FILE
    config = json.loads(path.read_text())
    config["model"]["decoder"]["num_hidden_layers"] = 3
    path.write_text(json.dumps(config))
    graph = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    assert "past_key_values.2.key" in (retarget_genai_config(path, graph, "model.onnx") or "")
    quantize(copy, tmp_path / "int4", WeightOnlyConfig.preset("int4"))
    assert not (tmp_path / "int4" / GENAI_CONFIG_FILE).exists()
    assert GENAI_CONFIG_FILE not in json.loads((tmp_path / "int4" / PACKAGE_MANIFEST).read_text())["files"]
    assert (tmp_path / "int4" / "config.json").is_file()


@pytest.mark.slow
def test_an_optimized_export_names_its_deployed_graph(minilm_dir: Path, tmp_path: Path) -> None:
    """``export --optimize O2`` deploys ``model_O2.onnx`` (its cache in ``GroupQueryAttention``): the config
    names it with onnxruntime-genai's shared cache buffer on, and onnxruntime-genai generates transformers'
    tokens with it, one prompt at a time and as a right-padded batch (the graph's positions follow the mask)."""
    src, out, result = export_causal_lm("llama", minilm_dir, tmp_path, optimize="O2")
    config = json.loads((out / GENAI_CONFIG_FILE).read_text())
    assert config["model"]["decoder"]["filename"] == "model_O2.onnx" == result.files["optimized_O2"]
    assert config["search"]["past_present_share_buffer"] is True
    prompts = _prompts(out)
    assert len({len(p) for p in prompts}) > 1  # the batch pads one row
    batch = _genai_greedy(out, prompts, NEW)
    for prompt, row in zip(prompts, batch, strict=True):
        (theirs,) = _genai_greedy(out, [prompt], NEW)
        reference = _transformers_greedy(src, prompt, NEW)
        _assert_continues(out, theirs, reference, prompt)
        _assert_continues(out, row, reference, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "phi3", "gemma3"])
def test_onnxruntime_genai_runs_other_decoders_like_transformers(
    name: str, minilm_dir: Path, tmp_path: Path
) -> None:
    """GPT-2 (learned positions), Phi-3 and Gemma 3 (a sliding-window layer; the longer prompt passes its
    window), one prompt at a time: a batch's right padding would sit inside the window (see docs/run.md)."""
    src, out, _ = export_causal_lm(name, minilm_dir, tmp_path)
    for prompt in _prompts(out):
        (theirs,) = _genai_greedy(out, [prompt], NEW)
        _assert_continues(out, theirs, _transformers_greedy(src, prompt, NEW), prompt)


@pytest.mark.slow
def test_encoder_decoder_packages_get_no_config(t5_with_past: Any) -> None:
    _, out, result = t5_with_past
    assert not (out / GENAI_CONFIG_FILE).exists()
    skipped = [s for s in result.stages if s["stage"] == "genai"]
    assert skipped and all(s["status"] == "skipped" and "one decoder graph" in s["detail"] for s in skipped)
