"""``pipeline()`` and ``create_pipeline()``: a ready pipeline from an exported folder or ``model.onnx``."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ..._stages import StageLog
from ...errors import ConfigError, TaskDetectionError
from ...metadata.schema import KEY_TASK
from ...metadata.store import read_metadata
from ...metadata.tasks import normalize_task
from ...onnxfile import resolve_model_path
from ...runtime.session import SessionConfig, create_session
from ...testtime.policy import TestTimePolicy
from ..processors import ONNXAutoProcessor
from ..processors.auto import DataProcessor
from .base import PIPELINES, ONNXPipeline

__all__ = ["pipeline", "create_pipeline", "resolve_task", "PROCESSOR_ARGS"]

#: transformers pipeline arguments that carry a processor.
PROCESSOR_ARGS = ("tokenizer", "image_processor", "feature_extractor", "processor")
log = logging.getLogger(__name__)


def resolve_task(task: str | None, metadata: dict[str, Any], model: str | os.PathLike[str]) -> str:
    """The given task, else the embedded one; a clear error when neither exists or no pipeline serves it."""
    if task:
        name = normalize_task(task)
    elif metadata.get(KEY_TASK):
        name = normalize_task(metadata[KEY_TASK])
    else:
        raise TaskDetectionError(
            f"{model} has no embedded task ({'no metadata' if not metadata else 'metadata without hf_pipeline_task'}) and none was given"
        )
    if name not in PIPELINES:
        raise TaskDetectionError(
            f"no pipeline for task {name!r}; pipelines exist for: {', '.join(sorted(PIPELINES))}",
            hint="pass --task with one of the listed tasks",
        )
    return name


def _session_config(
    providers: str | Sequence[str] | None, session_config: SessionConfig | None
) -> SessionConfig:
    cfg = session_config or SessionConfig()
    if providers:  # "cuda,cpu" or a list; SessionConfig splits and validates
        cfg = SessionConfig(**{**cfg.__dict__, "providers": providers})
    return cfg


def pipeline(
    task: str | None = None,
    model: str | os.PathLike[str] | None = None,
    data_processor: DataProcessor | None = None,
    providers: str | Sequence[str] | None = None,
    *,
    batch_size: int = 1,
    session_config: SessionConfig | None = None,
    test_time_policy: TestTimePolicy | dict[str, Any] | bool | None = None,
    **kwargs: DataProcessor | None,
) -> ONNXPipeline:
    """A task pipeline for an exported model; task and processor come from the embedded metadata when not given.

    ``data_processor`` (or ``tokenizer=`` / ``image_processor=`` / ``feature_extractor=`` / ``processor=``)
    overrides the auto-detected processor. ``test_time_policy``: None = the embedded one, False = off.
    """
    if model is None:
        raise ConfigError("pipeline() needs model=OUTPUT_DIR or model.onnx")
    given = {k: kwargs.pop(k) for k in PROCESSOR_ARGS if kwargs.get(k) is not None}
    if kwargs:
        raise ConfigError(f"unknown pipeline() arguments {sorted(kwargs)}")
    if data_processor is None and given:
        data_processor = next(iter(given.values()))
    stages = StageLog(logger=log)  # load progress at INFO: a big model's session takes a while
    with stages.stage("metadata") as st:
        file = resolve_model_path(model)
        metadata = read_metadata(file)
        name = resolve_task(task, metadata, model)
        st["detail"] = f"{file}, task {name}"
    cfg = _session_config(providers, session_config)
    with stages.stage("session") as st:
        session, info = create_session(file, cfg)
        st["detail"] = info.provider
    with stages.stage("processor") as st:
        sources = ONNXAutoProcessor.sources(file, session=session, metadata=metadata)
        processor = (
            ONNXAutoProcessor.wrap(data_processor, sources)
            if data_processor is not None
            else ONNXAutoProcessor.from_sources(sources)
        )
        st["detail"] = type(processor).__name__
    with stages.stage("pipeline"):
        pipe = PIPELINES[name](
            session,
            processor,
            metadata=metadata,
            session_info=info,
            model_path=file,
            batch_size=batch_size,
            test_time_policy=test_time_policy,
            session_config=cfg,
        )
    pipe.load_seconds = stages.seconds()
    return pipe


def create_pipeline(
    task: str | None,
    model: str | os.PathLike[str],
    data_processor: DataProcessor | None = None,
    **kwargs: object,
) -> ONNXPipeline:
    """Like :func:`pipeline`, routing ``data_processor`` to the argument the task's pipeline expects."""
    if data_processor is None:
        return pipeline(task, model, **kwargs)
    file = resolve_model_path(model)
    name = resolve_task(task, read_metadata(file), model)
    return pipeline(name, file, **{PIPELINES[name].processor_arg: data_processor}, **kwargs)
