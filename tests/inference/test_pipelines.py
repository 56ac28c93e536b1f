"""Pipelines: auto-detected from the metadata, same outputs as transformers' pipelines, batching, policies, CLI."""

from __future__ import annotations

import shutil
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import modelexport
from modelexport.cli.app import main
from modelexport.errors import ConfigError, MetadataIntegrityError, TaskDetectionError
from modelexport.inference import PIPELINES, create_pipeline, pipeline
from modelexport.metadata import write_metadata
from tests.helpers import assert_nested_close, message_lines
from tests.inference.tiny_tasks import CNN_LABELS

RNG = np.random.RandomState(1)
TEXTS = ["i love this movie", "what a terrible city", "john lives in london", "hello world", "good"]


def _image(h: int = 30, w: int = 30) -> Image.Image:
    return Image.fromarray((RNG.rand(h, w, 3) * 255).astype(np.uint8))


#: task -> (tiny model, call args, call kwargs). Every registered pipeline has a case (checked below).
CASES: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "feature-extraction": ("minilm", lambda: ("the capital of france is paris",), {}),
    "text-classification": ("seq_cls", lambda: (TEXTS[:2],), {}),
    "token-classification": ("token_cls", lambda: ("john lives in paris",), {}),
    "question-answering": (
        "qa",
        lambda: (),
        {"question": "who lives in paris ?", "context": "john lives in paris , the capital of france ."},
    ),
    "image-classification": ("image_cls", lambda: ([_image(), _image(40, 20)],), {}),
    "audio-classification": ("audio_cls", lambda: ([RNG.randn(6000).astype(np.float32)],), {"top_k": 2}),
    "object-detection": ("object_det", lambda: ([_image(48, 80), _image(30, 30)],), {"threshold": 0.0}),
    # a plain export (no cache): the whole sequence runs each step; with a cache see tests/generation
    "text-generation": ("causal_lm", lambda: (TEXTS[:2],), {"max_new_tokens": 6, "do_sample": False}),
}


#: Pipelines that need an encoder-decoder package (``--task *-with-past``); compared with transformers there.
COVERED_ELSEWHERE = {
    "text2text-generation": "tests/generation/test_seq2seq.py",
    "automatic-speech-recognition": "tests/generation/test_seq2seq.py (slow: tiny Whisper)",
    "image-text-to-text": "tests/generation/test_vlm.py",
}


@pytest.mark.must
def test_every_registered_pipeline_has_a_case() -> None:
    assert set(PIPELINES) == set(CASES) | set(COVERED_ELSEWHERE)


@pytest.mark.must
@pytest.mark.compat
@pytest.mark.parametrize("task", list(CASES))
def test_pipeline_equals_transformers(
    task: str, task_export: Any, task_source: Any, minilm_export: Any, minilm_dir: Path
) -> None:
    import transformers

    name, args, kwargs = CASES[task]
    result = minilm_export if name == "minilm" else task_export(name)
    ours = modelexport.pipeline(model=result.output_dir)  # task detected from the metadata
    assert ours.task == task
    call_args = args()
    got = ours(*call_args, **kwargs)
    source = minilm_dir if name == "minilm" else task_source(name)
    ref = REFERENCES.get(task, transformers.pipeline)(task, model=str(source))
    assert_nested_close(got, ref(*call_args, **kwargs), tol=1e-4)


def _has_pipeline(task: str) -> bool:
    from transformers.pipelines import SUPPORTED_TASKS

    return task in SUPPORTED_TASKS


def _question_answering(task: str, model: str) -> Any:
    """transformers 4's question-answering pipeline; 5 removed it, so there the reference is what it computed
    (top 1): the PyTorch model's start/end logits over the context's tokens and [CLS], softmaxed, the best
    span (start <= end < start + 15) by the product of probabilities, cut from the context by its offsets."""
    import torch
    import transformers

    if _has_pipeline(task):
        return transformers.pipeline(task, model=model)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    net = transformers.AutoModelForQuestionAnswering.from_pretrained(model).eval()

    def run(question: str, context: str) -> dict[str, Any]:
        enc = tok(question, context, return_offsets_mapping=True, return_tensors="pt")
        offsets = enc.pop("offset_mapping")[0].tolist()
        ids = enc["input_ids"][0].tolist()
        # the context's tokens, and the [CLS] token (kept in the softmax, as transformers 4 did)
        in_context = np.array(
            [s == 1 or t == tok.cls_token_id for s, t in zip(enc.sequence_ids(0), ids, strict=True)]
        )
        with torch.no_grad():
            out = net(**enc)
        probs = []
        for logits in (out.start_logits[0].numpy(), out.end_logits[0].numpy()):
            masked = np.where(in_context, logits, -10000.0)
            e = np.exp(masked - masked.max())
            probs.append(e / e.sum())
        scores = np.triu(np.outer(*probs)) - np.triu(np.outer(*probs), 15)
        start, end = np.unravel_index(int(scores.argmax()), scores.shape)
        first, last = offsets[start][0], offsets[end][1]
        return {
            "score": float(scores[start, end]),
            "start": first,
            "end": last,
            "answer": context[first:last],
        }

    return run


def _text_generation(task: str, model: str) -> Any:
    """transformers' text-generation pipeline. transformers 5's decodes the continuation alone and appends it
    to the prompt ("movie" + "and": WordPiece loses the space, and a "##" piece stays raw); 4's decoded
    prompt and continuation together and cut the prompt's text off, which is what ours does. Under 5 the
    reference is that: ``generate``'s tokens (greedy) decoded with transformers' own tokenizer."""
    import torch
    import transformers

    if transformers.__version__.split(".")[0] == "4":
        return transformers.pipeline(task, model=model)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    net = transformers.AutoModelForCausalLM.from_pretrained(model).eval()

    def run(texts: list[str], max_new_tokens: int, do_sample: bool) -> list[list[dict[str, str]]]:
        results = []
        for text in texts:
            ids = tok(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = net.generate(ids, max_new_tokens=max_new_tokens, do_sample=do_sample)
            full = tok.decode(out[0], skip_special_tokens=True)
            prompt = tok.decode(ids[0], skip_special_tokens=True)
            results.append([{"generated_text": text + full[len(prompt) :]}])
        return results

    return run


#: Tasks whose reference is not ``transformers.pipeline`` under every transformers version.
REFERENCES = {"question-answering": _question_answering, "text-generation": _text_generation}


@pytest.mark.sanity
def test_token_classification_simple_aggregation(task_export: Any, task_source: Any) -> None:
    import transformers

    text = "john lives in paris , the capital of france"
    ours = pipeline(model=task_export("token_cls").output_dir)(text, aggregation_strategy="simple")
    ref = transformers.pipeline(
        "token-classification", model=str(task_source("token_cls")), aggregation_strategy="simple"
    )
    assert ours and any(e["word"].count(" ") for e in ours)  # groups of several tokens
    assert_nested_close(ours, ref(text), tol=1e-5)
    with pytest.raises(ConfigError, match="aggregation_strategy"):
        pipeline(model=task_export("token_cls").output_dir)(text, aggregation_strategy="max")


@pytest.mark.must
def test_batches_equal_single_runs(task_export: Any) -> None:
    pipe = pipeline(model=task_export("seq_cls").output_dir, batch_size=2)
    batched = pipe(TEXTS, top_k=None)
    single = [pipe(t, top_k=None, batch_size=1) for t in TEXTS]
    assert_nested_close(batched, single, tol=1e-5)
    assert pipe(TEXTS[0]) == [pipe(TEXTS[0], top_k=1)[0]]  # transformers' legacy single-input format


@pytest.mark.must
def test_plain_cnn_pipeline_from_metadata_alone(cnn_export: Any, tmp_path: Path) -> None:
    """Only model.onnx: task, labels and pre-processing come from the embedded metadata."""
    import torch

    from tests.inference.tiny_tasks import plain_cnn

    lone = tmp_path / "model.onnx"
    shutil.copy(cnn_export.onnx_path, lone)
    pipe = modelexport.pipeline(model=lone)
    image = _image(28, 28)
    got = pipe(image, top_k=None)
    gray = np.asarray(image.convert("L").resize((8, 8), Image.BILINEAR), dtype=np.float32)
    x = torch.from_numpy(((gray / 255 - 0.5) / 0.5)[None, None].astype(np.float32))
    with torch.no_grad():
        probs = torch.softmax(plain_cnn()(x), -1)[0].numpy()
    expected = sorted(
        ({"label": CNN_LABELS[i], "score": float(p)} for i, p in enumerate(probs)), key=lambda d: -d["score"]
    )
    assert_nested_close(got, expected, tol=1e-4)


@pytest.mark.must
def test_fixed_batch_graph_is_padded_and_cut_back(cnn_static_export: Any, cnn_export: Any) -> None:
    static = pipeline(model=cnn_static_export.output_dir, batch_size=4)
    assert static.processor.fixed_batch == 2 and static.processor.fixed_hw == (8, 8)
    images = [_image(9, 9), _image(16, 12), _image(8, 8)]
    got = static(images, top_k=None)  # batches of 2 then 1 (padded to 2)
    assert_nested_close(got, pipeline(model=cnn_export.output_dir)(images, top_k=None), tol=1e-5)


@pytest.mark.must
def test_no_metadata_no_task_is_a_clear_error(cnn_nometa_export: Any) -> None:
    with pytest.raises(TaskDetectionError, match="no embedded task"):
        pipeline(model=cnn_nometa_export.output_dir)
    out = pipeline("image-classification", cnn_nometa_export.output_dir)(np.zeros((8, 8), np.uint8))
    assert [d["label"] for d in out] == ["LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3"] or len(out) == 4


@pytest.mark.sanity
def test_create_pipeline_routes_the_processor(task_export: Any) -> None:
    from transformers import AutoTokenizer, ViTImageProcessor

    folder = task_export("seq_cls").output_dir
    tok = AutoTokenizer.from_pretrained(str(folder))
    pipe = create_pipeline(None, folder, data_processor=tok)
    assert pipe.processor.tokenizer is tok and pipe.processor_arg == "tokenizer"
    image_folder = task_export("image_cls").output_dir
    pipe = create_pipeline(
        "image-classification",
        image_folder,
        data_processor=ViTImageProcessor.from_pretrained(str(image_folder)),
    )
    assert pipe.processor.kind == "image_processor"
    with pytest.raises(ConfigError, match="needs a image_processor"):
        pipeline("image-classification", image_folder, data_processor=tok)


@pytest.mark.sanity
def test_unknown_task_and_unsupported_task(task_export: Any) -> None:
    folder = task_export("seq_cls").output_dir
    with pytest.raises(ConfigError, match="unknown task"):
        pipeline("translate-everything", folder)
    with pytest.raises(TaskDetectionError, match="no pipeline for task"):
        pipeline("fill-mask", folder)


@pytest.mark.must
def test_embedded_test_time_policy_is_applied(cnn_export: Any, tmp_path: Path) -> None:
    from modelexport.testtime.engine import TestTimeEngine
    from modelexport.testtime.policy import TestTimePolicy

    dst = tmp_path / "pkg"
    shutil.copytree(cnn_export.output_dir, dst)
    policy = TestTimePolicy(tta_transforms=("identity", "hflip"), modality="image")
    write_metadata(dst, {"modelexport.test_time_policy": policy.to_dict()})
    image = _image(8, 8)
    pipe = pipeline(model=dst)
    assert pipe.policy == policy
    got = pipe(image, top_k=None)
    feeds = pipe.processor(images=[image])
    probs = TestTimeEngine(dst / "model.onnx", policy).predict(feeds)[0]
    assert {d["label"]: d["score"] for d in got} == pytest.approx(
        {CNN_LABELS[i]: float(p) for i, p in enumerate(probs)}, abs=1e-5
    )
    plain = pipeline(model=dst, test_time_policy=False)(image, top_k=None)
    assert plain != got  # the flip view changes the scores


@pytest.mark.compat
@pytest.mark.smoke
def test_infer_cli_text_image_audio(
    task_export: Any, cnn_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            ["infer", str(task_export("seq_cls").output_dir), "--text", "i love this movie", "--text", "bad"]
        )
        == 0
    )
    out = "\n".join(message_lines(capsys.readouterr().out))
    assert "task: text-classification" in out and "latency:" in out
    labels = ("negative", "neutral", "positive")
    assert any(f"i love this movie -> {label} 0." in out for label in labels), out  # label and score
    img = tmp_path / "x.png"
    _image(12, 12).save(img)
    assert main(["infer", str(cnn_export.output_dir), "--image", str(img), "--top-k", "2", "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert (
        len(doc["predictions"][0]) == 2
        and doc["provider"] == "CPUExecutionProvider"
        and doc["latency_ms"]["run"] > 0
    )
    wav = tmp_path / "a.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((RNG.randn(4000) * 3000).astype(np.int16).tobytes())
    assert main(["infer", str(task_export("audio_cls").output_dir), "--audio", str(wav)]) == 0
    assert "audio-classification" in capsys.readouterr().out
    text_dir = str(task_export("seq_cls").output_dir)
    assert main(["infer", text_dir, "--text", "good", "--ep", "tensorrt,cuda", "--batch-size", "2"]) == 0
    assert (
        "provider: CPUExecutionProvider" in capsys.readouterr().out
    )  # unavailable providers skipped, CPU last
    qa = task_export("qa").output_dir
    assert (
        main(["infer", str(qa), "--question", "who lives in paris ?", "--text", "john lives in paris ."]) == 0
    )
    assert "who lives in paris ? | john lives in paris . -> '" in capsys.readouterr().out  # the answer


@pytest.mark.must
def test_infer_cli_bad_input(
    task_export: Any, cnn_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = task_export("seq_cls").output_dir
    assert main(["infer", str(folder)]) == 1
    assert "exactly one kind of input" in capsys.readouterr().err
    assert main(["infer", str(folder), "--text", "x", "--ep", "nonsense"]) == 1
    assert "unknown execution provider" in capsys.readouterr().err
    dst = tmp_path / "pkg"
    shutil.copytree(cnn_export.output_dir, dst)
    import onnx

    proto = onnx.load(str(dst / "model.onnx"))
    next(
        p for p in proto.metadata_props if p.key == "hf_model_config"
    ).value = '{"id2label": {"0": "hacked"}}'
    onnx.save(proto, str(dst / "model.onnx"))
    with pytest.raises(MetadataIntegrityError):
        pipeline(model=dst)
    img = tmp_path / "x.png"
    _image().save(img)
    assert main(["infer", str(dst), "--image", str(img)]) == 1
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "Hint:" in err


@pytest.mark.sanity
def test_infer_cli_names_the_input_option_the_task_needs(
    cnn_export: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["infer", str(cnn_export.output_dir), "--text", "hello"]) == 1
    err = capsys.readouterr().err
    assert "takes --image, not --text" in err and "Traceback" not in err


@pytest.mark.must
def test_infer_cli_speech_options_are_checked_before_running(
    task_export: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--language / --task transcribe|translate: values checked before anything loads (an empty folder is
    never opened), and refused for a model that is no speech package; the Whisper pass-through runs in
    tests/generation/test_seq2seq.py (slow)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in (
        (["--text", "x", "--language", " "], "--language must be a language code"),
        (["--text", "x", "--task", "summarise"], "or transcribe or translate for a speech decoder"),
        (["--language", "fr", "--data", str(empty), "--output", str(tmp_path / "p.jsonl")], "not --data"),
    ):
        assert main(["infer", str(empty), *args]) == 1
        err = capsys.readouterr().err
        assert message in err and "no .onnx file" not in err, err
    folder = str(task_export("seq_cls").output_dir)
    for args in (["--task", "translate"], ["--language", "fr"]):
        assert main(["infer", folder, "--text", "good", *args]) == 1
        err = " ".join(message_lines(capsys.readouterr().err))
        assert "is for speech recognition" in err and "this model's task is text-classification" in err
        assert "Hint:" in err and "Traceback" not in err
