"""The one in-memory dataset every reader returns: inputs of one kind, integer labels and their names.

Readers differ in what they parse; training, evaluation, calibration and test-time policy search only
ever see this class, so a new file format never touches them. Labels are ``None`` only for data read
with ``require_labels=False`` (calibration needs inputs, not answers).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import DatasetError

__all__ = ["Dataset", "KINDS", "encode_labels"]

log = logging.getLogger(__name__)

#: What a dataset holds: ``texts`` (list[str]), ``images`` (list of HxWxC uint8 arrays), ``x`` (one ndarray,
#: samples on axis 0) or ``feeds`` (model-ready arrays named after the graph's inputs, samples on axis 0).
KINDS = ("text", "image", "tensor", "feeds")
_FIELDS = {"text": "texts", "image": "images", "tensor": "x", "feeds": "feeds"}


@dataclass(frozen=True)
class Dataset:
    """Inputs plus integer labels ``0..K-1``; ``label_names[i]`` is the original label of class ``i``."""

    kind: str
    labels: list[int] | None
    label_names: list[str]
    texts: list[str] | None = None
    images: list[np.ndarray] | None = None
    x: np.ndarray | None = None
    feeds: dict[str, np.ndarray] | None = None
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DatasetError(f"dataset kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        inputs = self.inputs
        if inputs is None:
            raise DatasetError(f"a {self.kind} dataset needs its {self._field} set")
        if self.feeds is not None:
            sizes = {name: len(a) for name, a in self.feeds.items()}
            if not sizes or len(set(sizes.values())) != 1:
                raise DatasetError(f"{self.source}: arrays need one sample count on axis 0, got {sizes}")
        if self.labels is None:
            return
        if self.size != len(self.labels):
            raise DatasetError(f"{self.source}: {self.size} inputs but {len(self.labels)} labels")
        bad = [y for y in self.labels if not 0 <= int(y) < len(self.label_names)]
        if bad:
            raise DatasetError(
                f"{self.source}: labels {sorted(set(bad))[:5]} outside 0..{len(self.label_names) - 1}"
            )

    @property
    def _field(self) -> str:
        return _FIELDS[self.kind]

    @property
    def inputs(self) -> Sequence[Any] | np.ndarray | dict[str, np.ndarray] | None:
        """The inputs whatever the kind (texts, images, the ``x`` array or the named ``feeds``)."""
        return getattr(self, self._field)

    @property
    def size(self) -> int:
        """Number of examples (also for unlabelled data)."""
        if self.feeds is not None:
            return len(next(iter(self.feeds.values())))
        return len(self.inputs)  # type: ignore[arg-type]

    @property
    def labelled(self) -> bool:
        return self.labels is not None

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    def __len__(self) -> int:
        return self.size

    def class_ids(self, id2label: Mapping[Any, str] | None = None) -> list[int] | None:
        """The labels as a model's class ids: integer names are ids already; words go through the
        model's ``id2label`` (case-insensitive); without a match, the sorted-name order ``0..K-1``."""
        if self.labels is None:
            return None
        names = self.label_names
        if all(_is_int(n) for n in names):
            return [int(names[y]) for y in self.labels]
        by_word = {str(v).strip().lower(): int(k) for k, v in (id2label or {}).items()}
        if by_word and all(n.lower() in by_word for n in names):
            return [by_word[names[y].lower()] for y in self.labels]
        if by_word:
            log.warning(
                "%s: labels %s are not all among the model's %s; using their sorted order as class ids",
                self.source,
                names,
                sorted(by_word),
            )
        return list(self.labels)

    def class_balance(self) -> dict[str, int]:
        """Examples per class name, in class order ({} when unlabelled)."""
        counts = Counter(self.labels or [])
        return {name: counts.get(i, 0) for i, name in enumerate(self.label_names)}

    def subset(self, indices: Sequence[int] | np.ndarray) -> Dataset:
        """A dataset with the given examples (same label mapping)."""
        idx = [int(i) for i in indices]
        sub: dict[str, Any] = {"labels": None if self.labels is None else [self.labels[i] for i in idx]}
        if self.kind == "text":
            sub["texts"] = [self.texts[i] for i in idx]  # type: ignore[index]
        elif self.kind == "image":
            sub["images"] = [self.images[i] for i in idx]  # type: ignore[index]
        elif self.kind == "feeds":
            sub["feeds"] = {k: v[idx] for k, v in self.feeds.items()}  # type: ignore[union-attr]
        else:
            sub["x"] = self.x[idx]  # type: ignore[index]
        return replace(self, **sub)

    def sample(self, limit: int, seed: int = 0) -> Dataset:
        """At most ``limit`` examples drawn without replacement (seeded), kept in file order."""
        if limit >= len(self):
            return self
        rng = np.random.default_rng(seed)
        return self.subset(np.sort(rng.choice(len(self), size=limit, replace=False)))

    def split(self, val_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
        """Stratified (train, val): every class keeps its share in both parts (at least one each)."""
        if not 0.0 < val_fraction < 1.0:
            raise DatasetError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
        if self.labels is None:
            raise DatasetError(f"{self.source}: has no labels; a stratified split needs them")
        rng = np.random.default_rng(seed)
        labels = np.asarray(self.labels)
        train_idx: list[int] = []
        val_idx: list[int] = []
        for cls in range(self.num_classes):
            members = rng.permutation(np.flatnonzero(labels == cls))
            if len(members) < 2:
                raise DatasetError(
                    f"{self.source}: class {self.label_names[cls]!r} has {len(members)} example(s); "
                    "a stratified split needs at least 2 per class",
                    hint="add examples of that class or remove it from the dataset",
                )
            n_val = min(max(1, round(len(members) * val_fraction)), len(members) - 1)
            val_idx.extend(members[:n_val].tolist())
            train_idx.extend(members[n_val:].tolist())
        return self.subset(sorted(train_idx)), self.subset(sorted(val_idx))

    def describe(self) -> str:
        """One line: size, kind, classes and balance (what the pipeline prints)."""
        if self.labels is None:
            return f"{len(self)} {self.kind} examples, unlabelled"
        balance = ", ".join(f"{k}: {v}" for k, v in self.class_balance().items())
        return f"{len(self)} {self.kind} examples, {self.num_classes} classes ({balance})"


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True


def encode_labels(
    raw: Sequence[Any], source: str, lines: Sequence[int] | None = None, min_classes: int = 2
) -> tuple[list[int], list[str]]:
    """Map raw labels (words or ids) to ``0..K-1``: integer labels keep their numeric order, others sort
    by name.

    Fails below ``min_classes`` (one class: nothing to learn) and names the first empty label's line.
    """
    names = [str(v).strip() for v in raw]
    for i, name in enumerate(names):
        if not name:
            where = f"line {lines[i]}" if lines is not None else f"record {i + 1}"
            raise DatasetError(f"{source}, {where}: empty label")
    unique = set(names)
    if len(unique) < min_classes:
        only = next(iter(unique)) if unique else "(none)"
        raise DatasetError(
            f"{source}: only one class ({only!r}) in {len(names)} examples; a classifier needs at least two",
            hint="check the label column (--label_column) and that the file holds examples of every class",
        )
    ordered = sorted(unique, key=int) if all(_is_int(n) for n in unique) else sorted(unique)
    index = {n: i for i, n in enumerate(ordered)}
    return [index[n] for n in names], ordered
