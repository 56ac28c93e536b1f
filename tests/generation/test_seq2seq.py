"""Encoder-decoder generation: ``--task text2text-generation-with-past`` (tiny T5) and
``automatic-speech-recognition-with-past`` (tiny Whisper) write Optimum's three graphs, tagged and checked;
Optimum loads the folder; our pipeline's tokens equal transformers' ``generate`` on the same PyTorch model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelexport.cli.app import main
from modelexport.errors import ConfigError
from modelexport.export.api import export
from modelexport.hierarchy.tags import TAG_KEY
from modelexport.inference import pipeline
from modelexport.metadata.schema import KEY_GENERATION, KEY_TASK
from modelexport.metadata.store import read_metadata
from modelexport.onnxfile import (
    read_manifest,
    recorded_files,
    resolve_model_path,
    sidecar_path_for,
    variant_file,
)
from modelexport.optimize import WeightOnlyConfig, quantize, tag_coverage

from .conftest import save_whisper

FILES = ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx")
PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog"]

#: The tiny T5 package takes ~30 s to export (three dynamo captures): the module runs in ``make test-slow``.
pytestmark = pytest.mark.slow


def _kv(base: str, sides: tuple[str, ...], layers: int = 2) -> list[str]:
    return [f"{base}.{i}.{side}.{kind}" for i in range(layers) for side in sides for kind in ("key", "value")]


def _io(path: Path) -> tuple[list[str], list[str]]:
    model = onnx.load(str(path), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def _tags_by_output(path: Path) -> dict[str, str]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        o: next(p.value for p in n.metadata_props if p.key == TAG_KEY)
        for n in model.graph.node
        for o in n.output
    }


@pytest.mark.must
def test_three_graphs_with_optimum_names(t5_with_past: Any) -> None:
    _, out, _ = t5_with_past
    text = ["input_ids", "encoder_hidden_states", "encoder_attention_mask"]
    assert _io(out / FILES[0]) == (["input_ids", "attention_mask"], ["last_hidden_state"])
    assert _io(out / FILES[1]) == (text, ["logits", *_kv("present", ("decoder", "encoder"))])
    assert _io(out / FILES[2]) == (
        [*text, *_kv("past_key_values", ("decoder", "encoder"))],
        ["logits", *_kv("present", ("decoder",))],
    )
    past = onnx.load(str(out / FILES[2]), load_external_data=False).graph.input[3]
    assert past.type.tensor_type.shape.dim[2].dim_param, "the past length must be dynamic"


@pytest.mark.must
def test_every_graph_fully_tagged_with_its_sidecar_and_parity(t5_with_past: Any) -> None:
    _, out, result = t5_with_past
    assert set(result.components) == set(FILES)
    for name, graph in result.components.items():
        assert graph.coverage["coverage_pct"] == 100.0, name
        assert max(graph.parity["max_abs_diff"].values()) < 1e-4, name
        sidecar = json.loads((out / name.replace(".onnx", "_hierarchy.json")).read_text())
        assert sidecar["nodes"], name
    assert result.coverage["coverage_pct"] == 100.0 and result.parity["passed"]
    assert len(result.parity["max_abs_diff"]) == 1 + 9 + 5  # every output of every graph


def test_caches_are_tagged_with_the_attention_that_writes_them(t5_with_past: Any) -> None:
    _, out, _ = t5_with_past
    first = _tags_by_output(out / FILES[1])
    assert first["present.1.decoder.key"].endswith("T5Block.1/T5LayerSelfAttention.0/T5Attention")
    assert first["present.1.encoder.value"].endswith("T5Block.1/T5LayerCrossAttention.1/T5Attention")
    assert _tags_by_output(out / FILES[0])["last_hidden_state"].startswith(
        "/T5ForConditionalGeneration/T5Stack.encoder"
    )


def test_package_manifest_and_metadata_record_graphs_and_cache_layout(t5_with_past: Any) -> None:
    _, out, _ = t5_with_past
    manifest = read_manifest(out)
    assert manifest["components"] == dict(
        zip(("encoder", "decoder", "decoder_with_past"), FILES, strict=True)
    )
    assert set(FILES) | {"generation_config.json", "config.json"} <= set(manifest["files"])
    assert resolve_model_path(out) == out / FILES[0]  # the package's entry: the encoder runs first
    for name in FILES:
        meta = read_metadata(out / name)
        assert meta[KEY_TASK] == "text2text-generation"
        record = meta[KEY_GENERATION]
        assert record["cache"]["layers"] == 2 and record["cache"]["head_dim"] == 16
        assert record["cross_attention_cache"]["shape"][2] == "encoder_sequence_length"
        assert record["cache_inputs"] == _kv("past_key_values", ("decoder", "encoder"))
        assert record["decoder_start_token_id"] == 0
    assert recorded_files(out) >= set(FILES)  # exporting again with --overwrite replaces our own files


@pytest.mark.optimum
def test_optimum_loads_the_folder_and_generates_like_transformers(t5_with_past: Any) -> None:
    import torch
    import transformers
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    src, out, _ = t5_with_past
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    enc.pop("token_type_ids", None)
    ours = ORTModelForSeq2SeqLM.from_pretrained(out).generate(**enc, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        ref = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(src)).generate(
            **enc, max_new_tokens=8, do_sample=False
        )
    np.testing.assert_array_equal(ours.numpy(), ref.numpy())


@pytest.fixture(scope="module")
def t5_gen(t5_with_past: Any) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """(pipeline, PyTorch model, the encoder's feeds for PROMPTS)."""
    import transformers

    src, out, _ = t5_with_past
    pipe = pipeline("text2text-generation", model=out)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(src)).eval()
    return pipe, model, pipe.processor(texts=PROMPTS)


@pytest.mark.must
@pytest.mark.parametrize(
    "options",
    [{}, {"repetition_penalty": 1.3}, {"num_beams": 3}],
    ids=["greedy", "repetition-penalty", "beam-search"],
)
def test_token_ids_equal_transformers_generate(t5_gen: Any, options: dict[str, Any]) -> None:
    import torch

    pipe, model, feeds = t5_gen
    assert feeds["attention_mask"][0, -1] == 0, "the batch is padded"
    ours = pipe.generate_from(feeds, pipe.settings(max_new_tokens=12, **{"num_beams": 1, **options}))
    with torch.no_grad():
        ref = model.generate(
            **{k: torch.tensor(v) for k, v in feeds.items()}, max_new_tokens=12, do_sample=False, **options
        )
    np.testing.assert_array_equal(ours, ref.numpy())
    assert len(set(ours[:, 1:].ravel().tolist())) > 2, "the tiny model must not repeat one token"


def test_sampling_reuses_the_seeded_sampler(t5_gen: Any) -> None:
    pipe, _, feeds = t5_gen
    greedy = pipe.generate_from(feeds, pipe.settings(max_new_tokens=6, num_beams=1))
    np.testing.assert_array_equal(
        pipe.generate_from(feeds, pipe.settings(max_new_tokens=6, do_sample=True, top_k=1, seed=1)), greedy
    )
    hot = dict(max_new_tokens=6, do_sample=True, temperature=5.0)
    a, b = (pipe.generate_from(feeds, pipe.settings(seed=7, **hot)) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, greedy)


def test_cache_and_encoder_states_stay_in_onnx_runtime(t5_gen: Any) -> None:
    import onnxruntime as ort

    pipe, _, feeds = t5_gen
    start = np.zeros((2, 1), np.int64)
    state = pipe._begin(start, start, feeds)
    scores, state = pipe._advance(start, start, 1, state)
    assert scores.shape == (2, pipe.model_config["vocab_size"])
    assert set(state.encoder) == {"encoder_hidden_states", "encoder_attention_mask"}
    assert len(state.past) == 8 and all(isinstance(v, ort.OrtValue) for v in state.past.values())
    cross = state.past["0.encoder.key"]
    _, state = pipe._advance(np.concatenate([start, start], 1), start, 1, state)
    assert state.past["0.encoder.key"] is cross, "the cross-attention cache is computed once"
    assert state.past["0.decoder.key"].shape()[2] == 2


def _text2text_reference(src: Path) -> Any:
    """transformers' text2text-generation pipeline (4.x); transformers 5 removed it, so there the reference
    is what it did: ``generate`` with its defaults (4 beams) and the tokenizer's decode without specials."""
    import torch
    import transformers
    from transformers.pipelines import SUPPORTED_TASKS

    if "text2text-generation" in SUPPORTED_TASKS:
        return transformers.pipeline("text2text-generation", model=str(src))
    tok = transformers.AutoTokenizer.from_pretrained(str(src))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(src)).eval()

    def run(texts: str | list[str], **options: Any) -> list[dict[str, str]]:
        enc = tok([texts] if isinstance(texts, str) else texts, padding=True, return_tensors="pt")
        enc.pop("token_type_ids", None)
        with torch.no_grad():
            ids = model.generate(**enc, **{"num_beams": 4, **options})
        return [{"generated_text": t} for t in tok.batch_decode(ids, skip_special_tokens=True)]

    return run


def test_outputs_and_defaults_equal_the_transformers_pipeline(t5_gen: Any, t5_with_past: Any) -> None:
    pipe, _, _ = t5_gen
    ref = _text2text_reference(t5_with_past[0])
    one = pipe(PROMPTS[0], max_new_tokens=5)
    assert isinstance(one, list) and set(one[0]) == {"generated_text"} and one[0]["generated_text"]
    assert one == ref(PROMPTS[0], max_new_tokens=5)  # the pipeline's default: 4 beams
    assert pipe(PROMPTS, max_new_tokens=5, num_beams=1) == ref(PROMPTS, max_new_tokens=5, num_beams=1)


def test_cli_infer_generates(t5_with_past: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = t5_with_past
    code = main(["infer", str(out), "--text", PROMPTS[0], "--max-new-tokens", "4", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["task"] == "text2text-generation"
    assert doc["predictions"][0]["generated_text"]  # one dict per text, as transformers
    assert main(["infer", str(out), "--text", PROMPTS[0], "--max-new-tokens", "3", "--num-beams", "1"]) == 0
    streamed = capsys.readouterr().out
    label = f"{PROMPTS[0][:60]} -> "
    assert label in streamed, "one greedy prompt streams its tokens after its label, on stdout"
    assert streamed.split(label, 1)[1].split("\n", 1)[0].strip()


def test_refusals_come_before_any_output(t5_with_past: Any, tmp_path: Path) -> None:
    import torch

    src, _, _ = t5_with_past
    with pytest.raises(ConfigError, match="not supported"):
        export(src, tmp_path / "a", task="text2text-generation-with-past", with_report=True)
    with pytest.raises(ConfigError, match="static is refused"):
        export(src, tmp_path / "a", task="text2text-generation-with-past", optimize="O2", quantize="static")
    with pytest.raises(ConfigError, match="is an encoder-decoder") as info:
        export(src, tmp_path / "b", task="text-generation-with-past")
    assert "text2text-generation-with-past" in str(info.value.hint)
    with pytest.raises(ConfigError, match="needs an encoder-decoder"):
        export(torch.nn.Linear(4, 2), tmp_path / "c", task="text2text-generation-with-past")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------- -O2 and int8 of every graph
#: int8 (dynamic) vs fp32 first-step logits (tiny T5, tiny Whisper): max abs diff over the logits' range.
#: int8 error, not garbage (a broken graph is off by the whole range): measured 6.3% on the tiny T5 (its weights
#: drawn 2x wide so that tokens vary under transformers 5; the bound was 5% at T5's default width), under 5% on
#: the tiny Whisper.
INT8_REL_BOUND = 0.1


def _graph_set(suffix: str) -> dict[str, str]:
    roles = ("encoder", "decoder", "decoder_with_past")
    return {role: variant_file(f, suffix) for role, f in zip(roles, FILES, strict=True)}


@pytest.fixture(scope="module")
def t5_o2_int8(t5_with_past: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    src, _, _ = t5_with_past
    out = tmp_path_factory.mktemp("t5_o2") / "out"
    return out, export(src, out, task="text2text-generation-with-past", optimize="O2", quantize="dynamic")


def _first_step_logits(pipe: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    start = np.full((len(next(iter(feeds.values()))), 1), pipe.start_id, np.int64)
    return pipe._advance(start, start, 1, pipe._begin(start, start, feeds))[0]


def _assert_int8_close(fp32: Any, int8: Any, feeds: dict[str, np.ndarray]) -> None:
    ref, got = _first_step_logits(fp32, feeds), _first_step_logits(int8, feeds)
    assert np.abs(got - ref).max() <= INT8_REL_BOUND * np.ptp(ref), np.abs(got - ref).max() / np.ptp(ref)


def _optimum_set(ort_model: Any, folder: Path, suffix: str) -> Any:
    """Optimum's ORTModel for seq2seq on one graph set of the package, by file name."""
    files = _graph_set(suffix)
    return ort_model.from_pretrained(
        folder,
        encoder_file_name=files["encoder"],
        decoder_file_name=files["decoder"],
        decoder_with_past_file_name=files["decoder_with_past"],
    )


@pytest.mark.must
def test_optimize_and_quantize_write_every_graph_tagged_checked_and_listed(t5_o2_int8: Any) -> None:
    out, result = t5_o2_int8
    o2, int8 = _graph_set("O2"), _graph_set("dynamic")
    manifest = read_manifest(out)
    assert manifest["variants"] == {"O2": o2, "dynamic": int8}
    assert manifest["deployed_model"] == "encoder_model_O2.onnx" == resolve_model_path(out).name
    graphs = [*FILES, *o2.values(), *int8.values()]
    assert {n for g in graphs for n in (g, sidecar_path_for(g).name)} <= set(manifest["files"])
    for role, exported in zip(o2, FILES, strict=True):
        generation = read_metadata(out / exported)[KEY_GENERATION]
        for name in (exported, o2[role], int8[role]):
            model = onnx.load(str(out / name))
            assert tag_coverage(model)["coverage_pct"] == 100.0, name
            assert len(json.loads(sidecar_path_for(out / name).read_text())["nodes"]) == len(model.graph.node)
            meta = read_metadata(out / name)  # carried: the task and the cache layout the pipeline reads
            assert meta[KEY_TASK] == "text2text-generation" and meta[KEY_GENERATION] == generation, name
    assert read_metadata(out / int8["decoder"])["modelexport.quantization"]["mode"] == "dynamic"
    assert read_metadata(out / o2["decoder"])["modelexport.optimization"]["preset_name"] == "O2"
    checked = result.parity["files"]  # each -O2 graph against PyTorch on its own example inputs
    assert set(checked) == set(o2.values()) and all(c["passed"] for c in checked.values())
    assert max(v for c in checked.values() for v in c["max_abs_diff"].values()) < 1e-4
    assert all(g.coverage["coverage_pct"] == 100.0 for g in result.components.values())


@pytest.mark.must
def test_o2_package_is_deployed_and_decodes_the_fp32_tokens(t5_o2_int8: Any, t5_gen: Any) -> None:
    out, _ = t5_o2_int8
    fp32, _, feeds = t5_gen
    o2 = pipeline("text2text-generation", model=out)
    assert o2.model_path == out / "encoder_model_O2.onnx"
    assert Path(o2.with_past._model_path) == out / "decoder_with_past_model_O2.onnx"
    for options in ({"num_beams": 1}, {"num_beams": 3}):
        settings = dict(max_new_tokens=12, **options)
        np.testing.assert_array_equal(
            o2.generate_from(feeds, o2.settings(**settings)),
            fp32.generate_from(feeds, fp32.settings(**settings)),
        )


def _t5_enc(src: Path) -> Any:
    import transformers

    enc = transformers.AutoTokenizer.from_pretrained(str(src))(PROMPTS, padding=True, return_tensors="pt")
    enc.pop("token_type_ids", None)
    return enc


@pytest.mark.must
def test_int8_package_stays_close(t5_o2_int8: Any, t5_gen: Any) -> None:
    """Our pipeline on encoder_model_dynamic.onnx opens the int8 decoders; first-step logits stay close."""
    out, _ = t5_o2_int8
    fp32, _, feeds = t5_gen
    int8 = pipeline("text2text-generation", model=out / "encoder_model_dynamic.onnx")
    assert Path(int8.first_step._model_path) == out / "decoder_model_dynamic.onnx"
    _assert_int8_close(fp32, int8, feeds)


@pytest.mark.optimum
def test_optimum_loads_the_int8_set_by_file_name_and_generates_our_tokens(
    t5_o2_int8: Any, t5_gen: Any, t5_with_past: Any
) -> None:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    out, _ = t5_o2_int8
    _, _, feeds = t5_gen
    int8 = pipeline("text2text-generation", model=out / "encoder_model_dynamic.onnx")
    ours = int8.generate_from(feeds, int8.settings(max_new_tokens=8, num_beams=1))
    optimum = _optimum_set(ORTModelForSeq2SeqLM, out, "dynamic")
    enc = _t5_enc(t5_with_past[0])
    np.testing.assert_array_equal(optimum.generate(**enc, max_new_tokens=8, do_sample=False).numpy(), ours)


@pytest.fixture(scope="module")
def t5_quantized_by_cli(t5_with_past: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``quantize FOLDER -o OUT`` on the exported package: (the new package, what the command printed)."""
    import contextlib
    import io

    _, out, _ = t5_with_past
    pkg = tmp_path_factory.mktemp("t5_int8_cli") / "int8"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["quantize", str(out), "-o", str(pkg)]) == 0
    return pkg, printed.getvalue()


def test_quantize_cli_on_the_folder_writes_a_whole_package(
    t5_with_past: Any, t5_quantized_by_cli: tuple[Path, str], t5_gen: Any
) -> None:
    _, out, _ = t5_with_past
    pkg, printed = t5_quantized_by_cli
    assert "Quantized the 3 graphs" in printed
    assert read_manifest(pkg)["components"] == read_manifest(out)["components"]
    assert all(tag_coverage(onnx.load(str(pkg / f)))["coverage_pct"] == 100.0 for f in FILES)
    fp32, _, feeds = t5_gen
    _assert_int8_close(fp32, pipeline("text2text-generation", model=pkg), feeds)


@pytest.mark.optimum
def test_optimum_loads_the_cli_quantized_package_and_generates_our_tokens(
    t5_with_past: Any, t5_quantized_by_cli: tuple[Path, str]
) -> None:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    pkg, _ = t5_quantized_by_cli
    enc = _t5_enc(t5_with_past[0])
    optimum = ORTModelForSeq2SeqLM.from_pretrained(pkg).generate(**enc, max_new_tokens=8, do_sample=False)
    pipe = pipeline("text2text-generation", model=pkg)
    ours = pipe.generate_from(pipe.processor(texts=PROMPTS), pipe.settings(max_new_tokens=8, num_beams=1))
    np.testing.assert_array_equal(optimum.numpy(), ours)


@pytest.fixture(scope="module")
def t5_int4_by_cli(t5_with_past: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``quantize FOLDER -o OUT --weights int4`` on the exported package: (the new package, what it printed)."""
    import contextlib
    import io

    _, out, _ = t5_with_past
    pkg = tmp_path_factory.mktemp("t5_int4_cli") / "int4"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["quantize", str(out), "-o", str(pkg), "--weights", "int4"]) == 0
    return pkg, printed.getvalue()


def test_weight_only_int4_quantizes_every_graph_into_a_package(
    t5_with_past: Any, t5_int4_by_cli: tuple[Path, str], t5_gen: Any, tmp_path: Path
) -> None:
    """Graph by graph, each with its sidecar and weights file, tags 100%. First-step logits: int4 is far on this
    32-wide T5 drawn 2x wide (one block per column; measured 0.50 of the logits' range, README), int8 weights
    close (measured 0.047; dynamic int8 0.062)."""
    _, out, _ = t5_with_past
    pkg, printed = t5_int4_by_cli
    assert "Quantized the 3 graphs" in printed and "weights: int4 rtn, block 32" in printed
    assert read_manifest(pkg)["components"] == read_manifest(out)["components"]
    for name in FILES:
        model = onnx.load(str(pkg / name))
        assert tag_coverage(model)["coverage_pct"] == 100.0 and (pkg / f"{name}.data").is_file()
        assert any(n.op_type == "MatMulNBits" for n in model.graph.node)
    fp32, _, feeds = t5_gen
    ref = _first_step_logits(fp32, feeds)
    int4 = _first_step_logits(pipeline("text2text-generation", model=pkg), feeds)
    assert np.abs(int4 - ref).max() <= 0.6 * np.ptp(ref), np.abs(int4 - ref).max() / np.ptp(ref)
    int8_pkg = tmp_path / "int8"
    quantize(out, int8_pkg, WeightOnlyConfig(weights="int8"))
    int8 = _first_step_logits(pipeline("text2text-generation", model=int8_pkg), feeds)
    assert np.abs(int8 - ref).max() <= 0.1 * np.ptp(ref), np.abs(int8 - ref).max() / np.ptp(ref)


def test_weight_only_refuses_calibration_on_a_package(t5_with_past: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gptq calibrates each graph"):
        quantize(
            t5_with_past[1], tmp_path / "q", WeightOnlyConfig(algorithm="gptq", calibration_data="x.csv")
        )
    assert not (tmp_path / "q").exists()


@pytest.mark.optimum
def test_optimum_loads_the_int4_package_and_generates_our_tokens(
    t5_with_past: Any, t5_int4_by_cli: tuple[Path, str]
) -> None:
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    pkg, _ = t5_int4_by_cli
    enc = _t5_enc(t5_with_past[0])
    optimum = ORTModelForSeq2SeqLM.from_pretrained(pkg).generate(**enc, max_new_tokens=8, do_sample=False)
    pipe = pipeline("text2text-generation", model=pkg)
    ours = pipe.generate_from(pipe.processor(texts=PROMPTS), pipe.settings(max_new_tokens=8, num_beams=1))
    np.testing.assert_array_equal(optimum.numpy(), ours)


# ------------------------------------------------------------------------------------------ Whisper
@pytest.fixture(scope="module")
def whisper(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    root = tmp_path_factory.mktemp("whisper")
    src = save_whisper(minilm_dir, root / "src")
    return src, root / "out", export(src, root / "out", task="automatic-speech-recognition-with-past")


def _waves() -> list[np.ndarray]:
    t = np.linspace(0, 200, 12000, dtype=np.float32)
    noise = np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1
    return [0.3 * np.sin(t), noise]


def _whisper_reference(src: Path) -> tuple[Any, Any]:
    """(the feature extractor's features for _waves(), transformers' greedy ``generate`` on them)."""
    import torch
    import transformers

    extractor = transformers.WhisperFeatureExtractor.from_pretrained(str(src))
    features = extractor(_waves(), sampling_rate=16000, return_tensors="pt")["input_features"]
    with torch.no_grad():
        ref = transformers.WhisperForConditionalGeneration.from_pretrained(str(src)).generate(
            features, max_new_tokens=8
        )
    return features, ref


def test_whisper_exports_three_graphs_and_decodes_like_transformers(whisper: Any) -> None:
    src, out, result = whisper
    assert result.coverage["coverage_pct"] == 100.0 and result.parity["passed"]
    assert _io(out / FILES[0]) == (["input_features"], ["last_hidden_state"])
    assert "encoder_attention_mask" not in _io(out / FILES[2])[0]
    _, ref = _whisper_reference(src)
    pipe = pipeline(model=out)
    assert pipe.task == "automatic-speech-recognition"
    ours = pipe.generate_from(pipe.processor(audio=_waves()), pipe.settings(max_new_tokens=8))
    np.testing.assert_array_equal(ours[:, 1:], ref.numpy())  # Whisper's generate drops the start token
    assert len(set(ours[:, 1:].ravel().tolist())) > 2
    text = pipe(_waves()[0], max_new_tokens=4)
    assert set(text) == {"text"} and text["text"]


@pytest.mark.optimum
def test_optimum_loads_the_whisper_folder_and_decodes_like_transformers(whisper: Any) -> None:
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    src, out, _ = whisper
    features, ref = _whisper_reference(src)
    optimum = ORTModelForSpeechSeq2Seq.from_pretrained(out).generate(features, max_new_tokens=8)
    np.testing.assert_array_equal(optimum.numpy(), ref.numpy())


#: A real Whisper checkpoint's prompt fields, on ids of the tiny model's (MiniLM) vocabulary.
_LANGS = {"<|en|>": 2000, "<|fr|>": 2001, "<|de|>": 2002}
_TASKS = {"transcribe": 2010, "translate": 2011}


def _checkpoint_like(src: Path, out: Path, tmp_path: Path, **fields: Any) -> tuple[Path, Any]:
    """A copy of the exported package whose generation_config.json describes a prompted, multilingual
    decoder like a real checkpoint's (languages, tasks, no-timestamps, suppressed tokens)."""
    import shutil

    import transformers

    folder = Path(shutil.copytree(out, tmp_path / "pkg"))
    config = transformers.GenerationConfig.from_pretrained(str(src))
    values = dict(lang_to_id=_LANGS, task_to_id=_TASKS, no_timestamps_token_id=2020, is_multilingual=True)
    for key, value in {**values, **fields}.items():
        setattr(config, key, value)
    config.save_pretrained(str(folder))
    return folder, config


@pytest.mark.parametrize(
    ("fields", "kwargs"),
    [
        ({}, {}),  # language detected from the first step, no task token, no-timestamps
        ({}, {"language": "fr", "task": "translate"}),
        ({"forced_decoder_ids": [[1, None], [2, _TASKS["transcribe"]]]}, {}),  # legacy configs
        ({"lang_to_id": {"<|en|>": 2000}}, {"language": "en"}),  # one language: transcribe added
    ],
)
def test_whisper_prompt_and_suppressed_tokens_follow_transformers_generate(
    whisper: Any, tmp_path: Path, fields: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    import torch
    import transformers

    src, out, _ = whisper
    model = transformers.WhisperForConditionalGeneration.from_pretrained(str(src)).eval()
    features = transformers.WhisperFeatureExtractor.from_pretrained(str(src))(
        _waves(), sampling_rate=16000, return_tensors="pt"
    )["input_features"]
    with torch.no_grad():  # the tokens the model picks unsuppressed: suppress the commonest of them
        plain = model.generate(features, max_new_tokens=8).numpy()
    common = np.bincount(plain[:, 1:].ravel()).argsort()[::-1][:2].tolist()
    folder, config = _checkpoint_like(
        src, out, tmp_path, suppress_tokens=[common[0]], begin_suppress_tokens=[common[1]], **fields
    )
    with torch.no_grad():  # the whole decoder sequence: prompt, then the generated tokens
        ref = model.generate(
            features, generation_config=config, max_new_tokens=8, return_dict_in_generate=True, **kwargs
        ).sequences.numpy()
    pipe = pipeline(model=folder)
    ours = pipe.generate_from(pipe.processor(audio=_waves()), pipe.settings(max_new_tokens=8), **kwargs)
    np.testing.assert_array_equal(ours, ref)
    assert ours.shape[1] > 9  # a prompt longer than the start token
    assert common[0] not in ours[:, 1:].tolist()
    assert pipe(_waves()[0], max_new_tokens=4, generate_kwargs=kwargs)["text"] is not None


def test_whisper_refuses_timestamps_and_unknown_languages(whisper: Any, tmp_path: Path) -> None:
    src, out, _ = whisper
    folder, _ = _checkpoint_like(src, out, tmp_path)
    pipe = pipeline(model=folder)
    with pytest.raises(ConfigError, match="return_timestamps"):
        pipe(_waves()[0], return_timestamps=True)
    with pytest.raises(ConfigError, match="languages"):
        pipe(_waves()[0], language="xx")
    with pytest.raises(ConfigError, match="task"):
        pipe(_waves()[0], task="summarize")


def test_each_graph_has_the_topology_of_a_plain_export(t5_with_past: Any, tmp_path: Path) -> None:
    src, _, _ = t5_with_past
    result = export(src, tmp_path / "out", task="text2text-generation-with-past", verify_topology=True)
    assert result.topology_identical is True
    assert all(graph.topology_identical for graph in result.components.values())


def _wav(path: Path, samples: np.ndarray) -> Path:
    import wave

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return path


def test_cli_infer_passes_language_and_task_to_the_speech_pipeline(
    whisper: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out, _ = whisper
    folder, _ = _checkpoint_like(src, out, tmp_path)
    wav = _wav(tmp_path / "a.wav", _waves()[0])
    args = ["infer", str(folder), "--audio", str(wav), "--max-new-tokens", "6", "--json"]
    assert main([*args, "--language", "fr", "--task", "translate"]) == 0
    text = json.loads(capsys.readouterr().out)["predictions"][0]["text"]
    pipe = pipeline(model=folder)
    assert text == pipe(str(wav), max_new_tokens=6, language="fr", task="translate")["text"]
    assert (
        text != pipe(str(wav), max_new_tokens=6, language="de", task="transcribe")["text"]
    )  # prompt differs
    for package, option, message in (
        (out, ["--language", "fr"], "no language tokens"),  # the tiny Whisper's own config has none
        (out, ["--task", "translate"], "no decoder task tokens"),
        (folder, ["--language", "xx"], "not one of this model's languages"),
    ):
        assert main(["infer", str(package), "--audio", str(wav), *option]) == 1
        err = capsys.readouterr().err
        assert message in err and "Hint:" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def whisper_o2_int8(whisper: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    src, _, _ = whisper
    opt = tmp_path_factory.mktemp("whisper_opt") / "opt"
    task = "automatic-speech-recognition-with-past"
    return opt, export(src, opt, task=task, optimize="O2", quantize="dynamic")


def test_whisper_o2_and_int8_packages(whisper: Any, whisper_o2_int8: Any) -> None:
    _, out, _ = whisper
    opt, result = whisper_o2_int8
    assert result.parity["passed"] and set(result.parity["files"]) == set(_graph_set("O2").values())
    fp32, o2 = pipeline(model=out), pipeline(model=opt)
    assert o2.model_path == opt / "encoder_model_O2.onnx"
    feeds = fp32.processor(audio=_waves())
    greedy = fp32.generate_from(feeds, fp32.settings(max_new_tokens=8))
    np.testing.assert_array_equal(o2.generate_from(feeds, o2.settings(max_new_tokens=8)), greedy)
    _assert_int8_close(fp32, pipeline(model=opt / "encoder_model_dynamic.onnx"), feeds)


@pytest.mark.optimum
def test_optimum_loads_the_whisper_int8_set_and_decodes_our_tokens(whisper_o2_int8: Any) -> None:
    import torch
    from optimum.onnxruntime import ORTModelForSpeechSeq2Seq

    opt, _ = whisper_o2_int8
    int8 = pipeline(model=opt / "encoder_model_dynamic.onnx")
    feeds = int8.processor(audio=_waves())
    ours = int8.generate_from(feeds, int8.settings(max_new_tokens=8))
    optimum = _optimum_set(ORTModelForSpeechSeq2Seq, opt, "dynamic")
    features = torch.from_numpy(feeds["input_features"])
    np.testing.assert_array_equal(optimum.generate(features, max_new_tokens=8).numpy(), ours[:, 1:])
