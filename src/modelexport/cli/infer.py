"""``modelexport infer MODEL --text ... | --image PATH | --audio PATH``: predictions and latency."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ..errors import ConfigError

__all__ = ["infer_cmd"]


#: processor modality -> the option that feeds it
_OPTION_FOR = {"texts": "--text", "images": "--image", "audio": "--audio"}


def _inputs(
    texts: tuple[str, ...], images: tuple[str, ...], audio: tuple[str, ...], question: str | None
) -> tuple[Any, str]:
    """The items to run and the processor modality they are for."""
    given = [(x, kind) for x, kind in ((texts, "texts"), (images, "images"), (audio, "audio")) if x]
    if len(given) != 1:
        raise ConfigError("give exactly one kind of input: --text, --image or --audio (each repeatable)")
    if question is not None:
        if not texts:
            raise ConfigError("--question needs --text as the context")
        return [{"question": question, "context": t} for t in texts], "texts"
    return list(given[0][0]), given[0][1]


def _check_modality(pipe: Any, kind: str) -> None:
    wanted = getattr(getattr(pipe, "processor", None), "modality", "")
    if wanted in _OPTION_FOR and wanted != kind:
        raise ConfigError(
            f"this model's task is {pipe.task}: it takes {_OPTION_FOR[wanted]}, not {_OPTION_FOR[kind]}",
            hint=f"run `modelexport infer MODEL {_OPTION_FOR[wanted]} ...`",
        )


def _jsonable(value: Any) -> Any:
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


def _generation_options(fn: Any) -> Any:
    for option in reversed(_GENERATION_OPTIONS):
        fn = option(fn)
    return fn


def _check_generation_options(
    pipe: Any, given: dict[str, Any], *, streaming: bool, kwargs: dict[str, Any]
) -> None:
    """Generation options only for text generation; one prompt on a terminal streams its tokens."""
    used = sorted(k for k, v in given.items() if v is not None)
    if pipe.task != "text-generation":
        if used:
            raise ConfigError(
                f"--{used[0].replace('_', '-')} is for text generation; this model's task is {pipe.task}"
            )
        return
    if streaming:
        kwargs["streamer"] = lambda text: click.echo(text, nl=False, err=True)


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
@click.option("--task", default=None, help="Task (default: the embedded one).")
@click.option(
    "--ep",
    "providers",
    default=None,
    help="Execution providers in order, e.g. cuda,cpu (CPU is always last).",
)
@click.option(
    "--batch-size",
    type=int,
    default=1,
    show_default=True,
    help="Inputs per ONNX Runtime run (padded per batch).",
)
@click.option(
    "--top-k",
    type=int,
    default=None,
    help="Labels per input for classification tasks; for text generation, sample from the k best tokens.",
)
@click.option("--json", "as_json", is_flag=True, help="Print predictions and timing as JSON.")
@_generation_options
def infer_cmd(
    model: str,
    texts: tuple[str, ...],
    question: str | None,
    images: tuple[str, ...],
    audio: tuple[str, ...],
    task: str | None,
    providers: str | None,
    batch_size: int,
    top_k: int | None,
    as_json: bool,
    **generation: Any,
) -> int:
    """Run MODEL (a .onnx file or an export folder) on the inputs with the auto-detected pipeline."""
    from ..inference import pipeline

    items, kind = _inputs(texts, images, audio, question)
    kwargs: dict[str, Any] = {}
    if top_k is not None:
        kwargs["top_k"] = top_k
    kwargs.update({k: v for k, v in generation.items() if v is not None})
    start = time.perf_counter()
    pipe = pipeline(task, model, providers=providers, batch_size=batch_size)
    load_ms = (time.perf_counter() - start) * 1000
    _check_modality(pipe, kind)
    _check_generation_options(pipe, generation, streaming=not as_json and len(items) == 1, kwargs=kwargs)
    start = time.perf_counter()
    predictions = pipe(items, **kwargs)
    run_ms = (time.perf_counter() - start) * 1000
    if "streamer" in kwargs:
        click.echo("", err=True)  # end the streamed line
    info = pipe.describe()
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
    click.echo(f"model: {info['model']}   task: {pipe.task}   provider: {info['provider']}")
    for item, pred in zip(items, predictions, strict=True):
        shown = json.dumps(_jsonable(pred))
        click.echo(f"{str(item)[:60]!s} -> {shown if len(shown) <= 400 else shown[:397] + '...'}")
    click.echo(
        f"latency: {run_ms:.1f} ms for {len(items)} input(s) ({run_ms / len(items):.1f} ms each), load {load_ms:.0f} ms"
    )
    return 0
