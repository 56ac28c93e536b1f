"""Resolve what the user calls a model into an ``nn.Module`` plus what we know of its source."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._transformers import quiet_loading
from ..errors import InvalidModelError, ModelLoadError, ModelNotFoundError
from .sentence import SentenceFolder, read_sentence_folder

if TYPE_CHECKING:
    import os

    import torch
    from transformers import PretrainedConfig, PreTrainedModel

__all__ = ["LoadedModel", "load_model", "LIBRARIES"]

#: What ``library=`` may say a model folder is: ``auto`` reads the folder (``modules.json`` with a Pooling
#: module is a sentence-transformers model, as Optimum infers it).
LIBRARIES = ("auto", "transformers", "sentence-transformers")

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model ready to export, and where it came from."""

    module: torch.nn.Module
    source: str  # "module" | "huggingface" | "factory" | "sentence-transformers"
    name_or_path: str | None = None
    model_dir: Path | None = None  # local folder holding config/tokenizer files, when there is one
    #: The transformers model inside ``module`` when ``module`` wraps one (a sentence-transformers model).
    wrapped: PreTrainedModel | None = None
    sentence: SentenceFolder | None = None  # the sentence-transformers folder it came from

    def info(self) -> dict[str, Any]:
        """What the sidecar and the report say about the model."""
        cls = type(self.module)
        return {
            "class": cls.__name__,
            "qualified_class": f"{cls.__module__}.{cls.__qualname__}",
            "source": self.source,
            "name_or_path": portable_name(self.name_or_path),
            "parameters": int(sum(p.numel() for p in self.module.parameters())),
        }

    @property
    def hf_config(self) -> PretrainedConfig | None:
        """The transformers config, for Hugging Face models (and the one a wrapper holds)."""
        model = self.module if self.wrapped is None else self.wrapped
        return getattr(model, "config", None) if _is_hf_model(model) else None


def portable_name(name_or_path: str | None) -> str | None:
    """Where a model came from, as a package may record it: a hub id or a relative path as given, an absolute
    path (``/home/me/models/my-model``, ``/abs/model.py:make``) by its last part, never the exporting machine's."""
    if not name_or_path:
        return name_or_path
    path, sep, factory = name_or_path.rpartition(":") if ".py:" in name_or_path else (name_or_path, "", "")
    return f"{Path(path).name}{sep}{factory}" if Path(path).is_absolute() else name_or_path


def _is_hf_model(module: object) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(module, PreTrainedModel)


def _check_module(obj: object, origin: str) -> torch.nn.Module:
    import torch

    if not isinstance(obj, torch.nn.Module):
        raise InvalidModelError(f"{origin} returned {type(obj).__name__}, not a torch.nn.Module")
    return obj


def _load_factory(spec: str) -> LoadedModel:
    """``path/to/file.py:factory`` or ``package.module:factory``."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise ModelNotFoundError(f"factory file not found: {path}")
        mod_name = f"_modelexport_factory_{abs(hash(path.resolve()))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise InvalidModelError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise ModelLoadError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ModelNotFoundError(f"cannot import module {target!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if factory is None:
        raise InvalidModelError(f"{target} has no attribute {attr!r}")
    try:
        obj = factory() if callable(factory) and not _is_module_instance(factory) else factory
    except Exception as exc:
        raise ModelLoadError(f"calling {spec} failed: {type(exc).__name__}: {exc}") from exc
    return LoadedModel(_check_module(obj, spec), "factory", name_or_path=spec)


def _is_module_instance(obj: object) -> bool:
    import torch

    return isinstance(obj, torch.nn.Module)


def _hf_model_class(config: PretrainedConfig) -> type:
    """The transformers class named by the config's ``architectures``, else ``AutoModel``."""
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick connection to the hub, so an offline machine fails in seconds, not after retries."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def _in_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an invalid repo id is simply not cached
        return False


def _load_hf(name_or_path: str, local: bool) -> LoadedModel:
    from transformers import AutoConfig

    if not local and not _in_cache(name_or_path) and not _hub_reachable():
        raise ModelNotFoundError(
            f"{name_or_path!r} is not a local path, not in the Hugging Face cache, and the hub is unreachable (offline)",
            hint="check the spelling; offline, use a local model folder or pre-download it into the HF cache",
        )
    kwargs = {"local_files_only": True} if local or _in_cache(name_or_path) else {}
    try:
        config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    except OSError as exc:
        if local:
            raise ModelLoadError(
                f"{name_or_path} is not a Hugging Face model folder (no loadable config.json): {exc}"
            ) from exc
        raise ModelNotFoundError(
            f"{name_or_path!r} is neither a local path nor a reachable/cached Hugging Face hub id ({exc.__class__.__name__})",
            hint="check the spelling; offline, use a local model folder or pre-download it into the HF cache",
        ) from exc
    except ValueError as exc:
        raise ModelLoadError(f"cannot read the config of {name_or_path}: {exc}") from exc
    cls = _hf_model_class(config)
    try:
        with quiet_loading():
            module = cls.from_pretrained(name_or_path, config=config, **kwargs)
    except Exception as exc:
        raise ModelLoadError(
            f"loading {name_or_path} with {cls.__name__} failed: {type(exc).__name__}: {exc}"
        ) from exc
    module.eval()
    model_dir = Path(name_or_path) if local else _cached_dir(name_or_path)
    return LoadedModel(module, "huggingface", name_or_path=name_or_path, model_dir=model_dir)


def _cached_dir(repo_id: str) -> Path | None:
    """The local snapshot folder of a hub model, so its tokenizer files can be packaged."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - only used to find processor files; absence is fine
        return None


def _as_sentence(loaded: LoadedModel, folder: SentenceFolder) -> LoadedModel:
    from .embedder import SentenceEmbedder  # torch modules: imported only for sentence-transformers folders

    return LoadedModel(
        SentenceEmbedder(loaded.module, folder).eval(),
        "sentence-transformers",
        name_or_path=loaded.name_or_path,
        model_dir=loaded.model_dir,
        wrapped=loaded.module,
        sentence=folder,
    )


def _load_folder(spec: str, library: str, local: bool) -> LoadedModel:
    """A transformers folder (or hub id), or the embedding model of a sentence-transformers folder."""
    folder = Path(spec) if local else _cached_dir(spec)
    sentence = read_sentence_folder(folder) if folder is not None and library != "transformers" else None
    if sentence is None:
        if library == "sentence-transformers":
            raise InvalidModelError(
                f"{spec} is not a sentence-transformers folder (no modules.json listing a Transformer "
                "and a Pooling module)",
                hint="drop --library to export it as a transformers model",
            )
        return _load_hf(spec, local=local)
    inner = _load_hf(str(sentence.transformer_dir), local=True)
    return _as_sentence(LoadedModel(inner.module, "huggingface", spec, inner.model_dir), sentence)


def load_model(model: torch.nn.Module | str | os.PathLike[str], library: str = "auto") -> LoadedModel:
    """Accept an ``nn.Module``, a local HF folder, a hub id, or ``file.py:factory`` / ``pkg.mod:factory``.

    ``library`` (one of :data:`LIBRARIES`) says how to read a folder: ``auto`` exports a
    sentence-transformers folder as its full embedding model, ``transformers`` its transformer alone.
    """
    if library not in LIBRARIES:
        raise InvalidModelError(f"library must be one of {', '.join(LIBRARIES)}, got {library!r}")
    if isinstance(model, LoadedModel):
        return model
    if _is_module_instance(model):
        source = "huggingface" if _is_hf_model(model) else "module"
        name = getattr(getattr(model, "config", None), "_name_or_path", None) or None
        model_dir = Path(name) if name and Path(name).is_dir() else None
        return LoadedModel(model.eval(), source, name_or_path=name, model_dir=model_dir)
    if not isinstance(model, (str, Path)):
        raise InvalidModelError(f"cannot export a {type(model).__name__}; pass an nn.Module or a model path")
    spec = str(model)
    path = Path(spec)
    if path.is_dir():
        return _load_folder(spec, library, local=True)
    if path.suffix == ".onnx":
        raise InvalidModelError(
            f"{spec} is already an ONNX file; export takes a PyTorch or Hugging Face model"
        )
    if ":" in spec and not path.exists():
        return _load_factory(spec)
    if path.exists():
        raise InvalidModelError(f"{spec} is a file; pass a model folder, a hub id, or 'file.py:factory'")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelNotFoundError(f"model path not found: {spec}")
    return _load_folder(spec, library, local=False)
