"""What differs between the transformers releases we support (4.57 to 5.x), in one place.

Every other module asks here instead of testing a version number, so supporting the next release is a
change to this file. Nothing here imports transformers at module level (``import modelexport`` stays
light); the version is read from the installed distribution's metadata.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import first_line

if TYPE_CHECKING:
    from transformers.processing_utils import ProcessorMixin

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_PARAMETERS",
    "cache_parameter",
    "output_cache",
    "transformers_version",
    "major_version",
    "STACK",
    "stack_versions",
    "processor_type_name",
    "image_processor_class",
    "quiet_loading",
    "load_processor",
]

#: forward()'s key/value-cache parameter, newest name first: transformers 5.2x renamed ``past_key_values``
#: to ``cache`` (the old keyword is still taken, with a warning, until 5.40) and the outputs' field with it.
CACHE_PARAMETERS = ("cache", "past_key_values")


def cache_parameter(parameters: Iterable[str]) -> str | None:
    """The name under which a ``forward`` with these parameter names takes its cache (None: no cache)."""
    names = set(parameters)
    return next((p for p in CACHE_PARAMETERS if p in names), None)


def output_cache(output: object) -> Any:
    """The cache a model output carries (``output.cache`` on transformers 5, ``past_key_values`` on 4)."""
    for name in CACHE_PARAMETERS:
        value = output.get(name) if hasattr(output, "get") else getattr(output, name, None)
        if value is not None:
            return value
    return None


#: The distributions whose versions an export records (those installed): the library whose classes a package
#: may still need at run time, and what built the graph.
STACK = ("transformers", "tokenizers", "huggingface-hub", "sentence-transformers", "torch")


def stack_versions() -> dict[str, str]:
    """Installed versions of :data:`STACK` (a distribution that is not installed is left out)."""
    found: dict[str, str] = {}
    for name in STACK:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


@functools.cache
def transformers_version() -> str:
    """The installed transformers' version ("" when it is not installed)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""


def major_version(version: str) -> int | None:
    """4 for "4.57.6", None for "" or a string that does not start with a number."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def processor_type_name(name: str) -> str:
    """A processor class's config name: transformers 5 without torchvision gives ``ViTImageProcessorPil``
    (the PIL backend) where 4.x gave ``ViTImageProcessor``; both write ``ViTImageProcessor`` in the config."""
    return name.removesuffix("Pil")


def image_processor_class(name: str | None, model_type: str | None = None) -> type | None:
    """transformers' PIL/numpy image processor class for a config's ``image_processor_type`` (else the
    model type's): transformers 5's ``*Pil`` backend (the one it uses without torchvision, whose output our
    numpy path equals), transformers 4's slow class. Never the torchvision backend, so pre-processing does
    not depend on whether torchvision is installed. None when transformers has no such class."""
    from transformers.models.auto import image_processing_auto as ip

    if not name and model_type:
        entry = ip.IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
        name = entry.get("pil") if isinstance(entry, dict) else (entry[0] if entry else None)
    if not name:
        return None
    base = processor_type_name(str(name).removesuffix("Fast"))
    return ip.get_image_processor_class_from_name(f"{base}Pil") or ip.get_image_processor_class_from_name(
        base
    )


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """No progress bars from transformers while the block loads a model (5.x draws "Loading weights" on every
    ``from_pretrained``; our commands report their own progress); the user's setting comes back after."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


#: A processor's sub-processors that may be left out when their backend is missing, by attribute: transformers 5
#: builds every video processor on torchvision, which cannot load beside a CPU torch; images never need it.
OPTIONAL_SUB_PROCESSORS = ("video_processor",)


def load_processor(folder: str | Path) -> Any:
    """transformers' own processor of a model folder (``AutoProcessor``: tokenizer, image processor, chat
    template). Where a sub-processor listed in :data:`OPTIONAL_SUB_PROCESSORS` needs a backend that is not
    installed (a video processor without torchvision: Qwen2-VL, SmolVLM), the processor is built without it,
    so images and text still go through the model's own class; video inputs then fail in transformers."""
    from transformers import AutoProcessor

    try:
        with quiet_loading():
            return AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    except ImportError as exc:
        return _without_missing_backends(Path(folder), exc)


def _without_missing_backends(folder: Path, error: ImportError) -> Any:
    import transformers
    from transformers.processing_utils import MODALITY_TO_AUTOPROCESSOR_MAPPING, ProcessorMixin

    processor_dict, kwargs = ProcessorMixin.get_processor_dict(str(folder), local_files_only=True)
    cls = getattr(transformers, str(processor_dict.get("processor_class") or ""), None)
    if cls is None or not issubclass(cls, ProcessorMixin):
        raise error
    args, left_out = [], []
    for name in cls.get_attributes():
        try:
            args.append(
                MODALITY_TO_AUTOPROCESSOR_MAPPING[name].from_pretrained(str(folder), local_files_only=True)
            )
        except ImportError:
            if name not in OPTIONAL_SUB_PROCESSORS:
                raise
            args.append(None)
            left_out.append(name)
    log.info("%s built without %s (%s)", cls.__name__, ", ".join(left_out), first_line(error))
    with _accepting_none(cls, set(left_out)):
        return cls.from_args_and_dict(args, processor_dict, **kwargs)


@contextlib.contextmanager
def _accepting_none(cls: type[ProcessorMixin], names: set[str]) -> Iterator[None]:
    """While the block runs, ``cls``'s class check of its sub-processors accepts None for ``names``."""
    original = cls.check_argument_for_proper_class

    def check(self: ProcessorMixin, argument_name: str, argument: object) -> Any:
        if argument is None and argument_name in names:
            return None
        return original(self, argument_name, argument)

    had_own = "check_argument_for_proper_class" in cls.__dict__
    saved = cls.__dict__.get("check_argument_for_proper_class")
    cls.check_argument_for_proper_class = check
    try:
        yield
    finally:
        if had_own:
            cls.check_argument_for_proper_class = saved
        else:
            del cls.check_argument_for_proper_class
