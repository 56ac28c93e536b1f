"""``modelexport infer MODEL --text ... | --image PATH | --audio PATH``: predictions and latency.

``modelexport infer MODEL --data PATH --output PRED.parquet [--engine ray ...]``: a whole dataset, written
to a file (see :func:`modelexport.batch.batch_infer`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from ..batch import batch_infer
from ..errors import ConfigError
from ..inference import pipeline
from ..inference.pipelines.base import ONNXPipeline
from ..inference.pipelines.seq2seq import SPEECH_DECODER_TASKS, SpeechRecognitionPipeline
from ..inference.pipelines.vlm import check_images, is_vision_text_package, pair_inputs
from ..metadata import read_metadata
from ..metadata.schema import KEY_TEST_TIME_POLICY
from ..metadata.tasks import normalize_task
from ..onnxfile import resolve_model_path
from ..testtime.policy import TestTimePolicy
from .display import WrappedStream, echo, progress
from .options import Decorated, OptionValue, overwrite_option, ray_engine_options, stacked
from .test_time_options import ensemble_iteration_options, iteration_from

__all__ = ["infer_cmd"]


#: processor modality -> the option that feeds it
_OPTION_FOR = {"texts": "--text", "images": "--image", "audio": "--audio"}


def _inputs(
    texts: tuple[str, ...],
    images: tuple[str, ...],
    audio: tuple[str, ...],
    question: str | None,
    vision_text: bool = False,
) -> tuple[Any, str]:
    """The items to run and the processor modality they are for; a vision-language package takes --image and
    --text together (paired in order; one of either goes with every one of the other)."""
    if vision_text:
        if audio or question is not None or not images or not texts:
            raise ConfigError(
                "this model is image-text-to-text: give --image and --text (each repeatable, paired in order)",
                hint='e.g. --image photo.png --text "Describe the image."',
            )
        return pair_inputs(list(images), list(texts)), "images+texts"
    given = [(x, kind) for x, kind in ((texts, "texts"), (images, "images"), (audio, "audio")) if x]
    if len(given) != 1:
        raise ConfigError("give exactly one kind of input: --text, --image or --audio (each repeatable)")
    if question is not None:
        if not texts:
            raise ConfigError("--question needs --text as the context")
        return [{"question": question, "context": t} for t in texts], "texts"
    return list(given[0][0]), given[0][1]


def _check_modality(pipe: ONNXPipeline, kind: str, question: str | None = None) -> None:
    if question is not None and pipe.task != "question-answering":
        raise ConfigError(
            f"--question is for question-answering models; this model's task is {pipe.task}",
            hint="leave --question out, or give a question-answering model",
        )
    wanted = getattr(getattr(pipe, "processor", None), "modality", "")
    if wanted in _OPTION_FOR and wanted != kind:
        raise ConfigError(
            f"this model's task is {pipe.task}: it takes {_OPTION_FOR[wanted]}, not {_OPTION_FOR[kind]}",
            hint=f"run `modelexport infer MODEL {_OPTION_FOR[wanted]} ...`",
        )


def _speech_options(task: str | None, language: str | None) -> tuple[str | None, dict[str, str]]:
    """(the pipeline task, the speech decoder's prompt options) from --task and --language, before any work:
    --task transcribe|translate is the decoder's task (Whisper's ``task=``), any other --task the pipeline's."""
    prompt: dict[str, str] = {}
    if task is not None and task.strip().lower() in SPEECH_DECODER_TASKS:
        prompt["task"], task = task.strip().lower(), None
    elif task is not None:
        try:
            normalize_task(task)
        except ConfigError as exc:
            decoder = " or ".join(SPEECH_DECODER_TASKS)
            raise ConfigError(
                str(exc), hint=f"--task is a pipeline task, or {decoder} for a speech decoder"
            ) from exc
    if language is not None:
        if not language.strip() or any(c.isspace() for c in language.strip()):
            raise ConfigError(f"--language must be a language code such as en or fr, got {language!r}")
        prompt["language"] = language.strip()
    return task, prompt


def _check_speech_options(pipe: ONNXPipeline, prompt: dict[str, str]) -> None:
    """--language / --task transcribe|translate only for a speech package whose decoder can be prompted so."""
    if not prompt:
        return
    given = " and ".join(f"--{k} {v}" for k, v in sorted(prompt.items()))
    if not isinstance(pipe, SpeechRecognitionPipeline):
        raise ConfigError(
            f"{given} is for speech recognition (Whisper-style packages); this model's task is {pipe.task}",
            hint="leave it out, or pass a package exported with --task automatic-speech-recognition-with-past",
        )
    pipe.check_prompt(**prompt)


# --- batch: --data PATH --output PRED, on this process or on Ray ------------------------------------------


def _batch_options(fn: Decorated) -> Decorated:
    """The options of a dataset run (one block, so other options stay independent of it)."""
    options = [
        click.option(
            "--data",
            type=click.Path(exists=True),
            default=None,
            help="Dataset to score: CSV/TSV/JSON/JSONL/Parquet/.txt, an image folder, or a .npz of "
            "model-ready arrays (x, or one array per model input; rows on axis 0; the processor is skipped).",
        ),
        click.option(
            "--output",
            type=click.Path(),
            default=None,
            help="Predictions: PRED.parquet or PRED.jsonl, or a folder (DIR/) that gets predictions.parquet.",
        ),
        overwrite_option("--output"),
        click.option(
            "--keep-columns", default="", help="Input columns copied to the output, comma separated."
        ),
        click.option(
            "--input-column", default=None, help="The text or image-path column (default: detected by name)."
        ),
    ]
    fn = stacked(options)(fn)
    return ray_engine_options(
        "local: this process, with a progress bar; ray: Ray Data actors (pip install 'modelexport[distributed]')."
    )(fn)


_BATCH_DEFAULTS = {
    "output": None,
    "overwrite": False,
    "engine": "local",
    "num_workers": 1,
    "threads_per_worker": 1,
    "address": None,
}


def _batch_only(batch: dict[str, Any], has_items: bool) -> None:
    """--data and --text/--image/--audio exclude each other; the dataset options need --data."""
    if batch["data"] is not None and has_items:
        raise ConfigError("give --data or --text/--image/--audio, not both")
    if batch["data"] is not None and batch["output"] is None:
        raise ConfigError("--data needs --output PRED.parquet or PRED.jsonl")
    changed = [k for k, v in _BATCH_DEFAULTS.items() if batch[k] != v] + [
        k for k in ("keep_columns", "input_column") if batch[k]
    ]
    if batch["data"] is None and changed:
        raise ConfigError(f"--{changed[0].replace('_', '-')} needs --data")


def _run_batch(
    model: str,
    task: str | None,
    providers: str | None,
    batch_size: int,
    top_k: int | None,
    as_json: bool,
    batch: dict[str, Any],
) -> int:
    with progress(f"infer {model} on {batch['data']} ({batch['engine']})", spinner=False):
        result = batch_infer(
            model,
            batch["data"],
            batch["output"],
            batch["engine"],
            num_workers=batch["num_workers"],
            threads_per_worker=batch["threads_per_worker"],
            batch_size=batch_size,
            address=batch["address"],
            keep_columns=batch["keep_columns"],
            task=task,
            input_column=batch["input_column"],
            providers=providers,
            call_kwargs={} if top_k is None else {"top_k": top_k},
            progress=not as_json,
            overwrite=batch["overwrite"],
        )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return 0
    echo(
        f"wrote {result.rows} row(s) to {result.output} ({result.task}, engine {batch['engine']}): "
        f"{result.seconds:.1f} s, {result.rows_per_s:.1f} rows/s"
    )
    if result.errors:
        first = result.error_examples[0]
        echo(
            f"{result.errors} row(s) failed and were written with an error, e.g. id {first['id']}: {first['error']}",
            more="--json",
            err=True,
        )
    return 0


def _jsonable(value: object) -> object:
    """``value`` for ``json.dumps``: numpy scalars (what has ``item()``) as Python values, in dicts and lists."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value.item() if hasattr(value, "item") else value


# ---------------------------------------------------------------------------------- text generation
_GENERATION_OPTIONS = (
    click.option(
        "--max-new-tokens", type=click.IntRange(min=1), default=None, help="Text generation: tokens to add."
    ),
    click.option(
        "--do-sample", is_flag=True, default=None, help="Text generation: sample instead of greedy."
    ),
    click.option(
        "--temperature",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Sampling temperature.",
    ),
    click.option(
        "--top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="Nucleus sampling mass."
    ),
    click.option(
        "--repetition-penalty",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Penalty for repeats.",
    ),
    click.option(
        "--num-beams", type=click.IntRange(min=1), default=None, help="Text generation: beam search width."
    ),
    click.option("--seed", type=int, default=None, help="Text generation: random seed for sampling."),
)


#: The keyword names click gives the generation options (split from the batch options in infer_cmd).
GENERATION_KEYS = (
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_p",
    "repetition_penalty",
    "num_beams",
    "seed",
)


def _generation_options(fn: Decorated) -> Decorated:
    return stacked(_GENERATION_OPTIONS)(fn)


def _check_generation_options(
    pipe: ONNXPipeline, given: dict[str, Any], *, streaming: bool, kwargs: dict[str, Any]
) -> None:
    """Generation options only for generating pipelines; one prompt on a terminal streams its tokens."""
    used = sorted(k for k, v in given.items() if v is not None)
    if not pipe.generates:
        if used:
            raise ConfigError(
                f"--{used[0].replace('_', '-')} is for text generation; this model's task is {pipe.task}"
            )
        return
    if streaming:  # after "PROMPT -> ": the continuation as it comes, wrapped at the terminal's width
        kwargs["streamer"] = WrappedStream(0)


@click.command("infer")
@click.argument("model", type=click.Path(exists=True))
@click.option("--text", "texts", multiple=True, help="Input text (repeatable); the context with --question.")
@click.option("--question", default=None, help="Question for question-answering (the --text is the context).")
@click.option(
    "--image",
    "images",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Image file (repeatable).",
)
@click.option(
    "--audio",
    "audio",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="PCM .wav file (repeatable).",
)
@click.option(
    "--task",
    default=None,
    help="Pipeline task (default: the embedded one); for a speech package, transcribe or translate: the "
    "decoder's task (Whisper; needs task tokens in its generation_config.json).",
)
@click.option(
    "--language",
    default=None,
    help="Speech recognition: the spoken language as a code of the package's generation_config.json "
    "(lang_to_id: en, fr, ...); default: detected per input when the package has language tokens.",
)
@click.option(
    "--ep",
    "providers",
    default=None,
    help="Execution providers in order, e.g. cuda,cpu (CPU is always last).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Inputs per ONNX Runtime run (padded per batch); default 1, with --data 32.",
)
@click.option(
    "--top-k",
    type=click.IntRange(min=1),
    default=None,
    help="Labels per input for classification tasks; for text generation, sample from the k best tokens.",
)
@click.option(
    "--mc-dropout",
    type=click.IntRange(min=0),
    default=None,
    help="Classifiers: MC-dropout passes per input, added to the embedded test-time policy (0: off; needs an "
    "export with --keep-dropout).",
)
@ensemble_iteration_options("Classifiers: ", "from zeros")
@click.option("--json", "as_json", is_flag=True, help="Print predictions and timing as JSON.")
@_batch_options
@_generation_options
def infer_cmd(
    model: str,
    texts: tuple[str, ...],
    question: str | None,
    images: tuple[str, ...],
    audio: tuple[str, ...],
    task: str | None,
    language: str | None,
    providers: str | None,
    batch_size: int | None,
    top_k: int | None,
    mc_dropout: int | None,
    ensemble: tuple[str, ...],
    iterate: int | None,
    feedback: str,
    loop: str,
    tol: float | None,
    as_json: bool,
    **options: OptionValue,
) -> int:
    """Run MODEL (a .onnx file or an export folder) on the inputs with the auto-detected pipeline.

    With --data PATH --output PRED.parquet|.jsonl: every row of a dataset, on this process or on Ray.
    """

    generation = {k: options.pop(k) for k in GENERATION_KEYS}
    batch = options
    _batch_only(batch, bool(texts or images or audio or question))
    task, prompt = _speech_options(task, language)
    policy = _test_time_policy(model, mc_dropout)
    iteration = iteration_from(iterate, feedback, loop, tol)
    if batch["data"] is not None:
        if mc_dropout is not None or ensemble or iteration:
            raise ConfigError(
                "--mc-dropout, --ensemble and --iterate apply to --text/--image inputs, not --data"
            )
        if prompt:
            raise ConfigError(
                "--language and --task transcribe|translate apply to --audio inputs, not --data"
            )
        return _run_batch(model, task, providers, batch_size or 32, top_k, as_json, batch)
    batch_size = batch_size or 1
    vision_text = bool(images or texts) and is_vision_text_package(model, task)
    items, kind = _inputs(texts, images, audio, question, vision_text)
    if vision_text:
        check_images(model, images)  # an image the model cannot take fails here, before any graph loads
    kwargs: dict[str, Any] = dict(prompt)
    if top_k is not None:
        kwargs["top_k"] = top_k
    kwargs.update({k: v for k, v in generation.items() if v is not None})
    start = time.perf_counter()
    with progress(f"infer {model}: loading"):
        pipe = pipeline(task, model, providers=providers, batch_size=batch_size, test_time_policy=policy)
    if ensemble or iteration:
        if not hasattr(pipe, "feed_probabilities"):
            raise ConfigError(
                f"--ensemble and --iterate are for classifiers; this model's task is {pipe.task}"
            )
        pipe.configure_test_time(ensemble, iteration)
    load_ms = (time.perf_counter() - start) * 1000
    _check_modality(pipe, kind, question)
    _check_speech_options(pipe, prompt)
    _check_generation_options(pipe, generation, streaming=not as_json and len(items) == 1, kwargs=kwargs)
    info = pipe.describe()
    streamed = "streamer" in kwargs
    if streamed:  # the header, then the prompt and its continuation as it comes: each printed once
        echo(f"model: {info['model']}   task: {pipe.task}   provider: {info['provider']}")
        click.echo(f"{_item(items[0])} -> ", nl=False)
        kwargs["streamer"].column = len(f"{_item(items[0])} -> ")
    start = time.perf_counter()
    predictions = pipe(items, **kwargs)
    run_ms = (time.perf_counter() - start) * 1000
    if streamed:
        click.echo("")  # end the streamed line
    if as_json:
        doc = {
            "model": info["model"],
            "task": pipe.task,
            "provider": info["provider"],
            "predictions": _jsonable(predictions),
            "latency_ms": {
                "load": round(load_ms, 2),
                "run": round(run_ms, 2),
                "per_input": round(run_ms / len(items), 2),
            },
        }
        click.echo(json.dumps(doc, indent=2))
        return 0
    if not streamed:
        echo(f"model: {info['model']}   task: {pipe.task}   provider: {info['provider']}")
    lines = []
    if not streamed:
        lines += [
            f"{_item(item)} -> {_prediction(pred, item)}"
            for item, pred in zip(items, predictions, strict=True)
        ]
    lines.append(
        f"latency: {run_ms:.1f} ms for {len(items)} input(s) ({run_ms / len(items):.1f} ms each), "
        f"load {load_ms:.0f} ms"
    )
    echo("\n".join(lines), more="--json", wrap=False)
    return 0


def _test_time_policy(model: str, mc_dropout: int | None) -> TestTimePolicy | None:
    """The embedded test-time policy with ``--mc-dropout`` passes (None: the embedded one as it is)."""
    if mc_dropout is None:
        return None
    stored = read_metadata(resolve_model_path(model)).get(KEY_TEST_TIME_POLICY)
    base = TestTimePolicy.from_dict(dict(stored)) if stored else TestTimePolicy()
    return base.with_changes(mc_dropout=mc_dropout)


def _item(item: str | dict[str, Any]) -> str:
    """An input as a line starts with it: a text, a question, or an image or audio file."""
    if isinstance(item, dict) and "images" in item:  # a vision-language (image, prompt) pair, by file name
        images = item["images"] if isinstance(item["images"], list | tuple) else [item["images"]]
        return f"{', '.join(Path(str(i)).name for i in images)}: {item['text']}"[:60]
    if isinstance(item, dict):
        return f"{item.get('question', '')} | {item.get('context', '')}"
    return str(item)[:60]


def _prediction(pred: object, item: str | dict[str, Any] | None = None) -> str:
    """A prediction in a few words: labels with scores, generated text (after its prompt, as streamed), or an
    embedding's size and first values."""
    pred = _jsonable(pred)
    if isinstance(pred, dict) and len(pred) == 1 and isinstance(next(iter(pred.values())), str):
        text = next(iter(pred.values()))  # {"generated_text": ...}, {"text": ...}
        prompt = item if isinstance(item, str) else None
        return text[len(prompt) :].strip() if prompt and text.startswith(prompt) else text
    if isinstance(pred, list) and len(pred) == 1 and isinstance(pred[0], dict) and len(pred[0]) == 1:
        return _prediction(pred[0], item)
    if isinstance(pred, list) and pred and all(_named(p) for p in pred):
        return ", ".join(_named(p) or "" for p in pred)
    if _named(pred):
        return _named(pred) or ""
    values = np.asarray(pred, dtype=object)
    if values.size > 8 and values.dtype == object and _numeric(pred):
        flat = np.asarray(pred, dtype=np.float64)
        start = ", ".join(f"{v:.4f}" for v in flat.reshape(-1)[:4])
        return f"{' x '.join(map(str, flat.shape))} values [{start}, ...]"
    return json.dumps(pred, ensure_ascii=False)


#: Fields that name what a prediction found: a class, an answer, an entity (with its words).
_NAMES = ("label", "answer", "entity_group", "entity")


def _named(pred: object) -> str | None:
    """``positive 0.981``, ``'paris' 0.412``, ``LOC paris 0.97``: a prediction dict's name and score."""
    if not isinstance(pred, dict):
        return None
    name = next((k for k in _NAMES if k in pred), None)
    if name is None:
        return None
    value = repr(pred[name]) if name == "answer" else str(pred[name])
    if name != "answer" and "word" in pred:
        value += f" {pred['word']}"
    return f"{value} {pred['score']:.3f}" if isinstance(pred.get("score"), float) else value


def _numeric(value: object) -> bool:
    try:
        np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return True
