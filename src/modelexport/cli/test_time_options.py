"""Options of the test-time methods that run beside a model (``evaluate``, ``infer``): an ensemble and
iterative inference. Apart from :mod:`.options` because the iteration builds ONNX graphs: only the commands
that take these options import it, so ``--help`` stays fast."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..errors import ConfigError
from ..testtime.iterative import LOOPS, Iteration
from .options import stacked

__all__ = ["ensemble_iteration_options", "iteration_from"]


def ensemble_iteration_options(subject: str, start: str) -> Callable[[Any], Any]:
    """``--ensemble``, ``--iterate``, ``--feedback``, ``--loop``, ``--tol`` (``evaluate``, ``infer``): one
    definition, so both commands take and explain them alike. ``subject`` starts each help text (``"Classifiers: "``
    or ``""``); ``start`` says where fed-back inputs start."""

    def sentence(text: str) -> str:
        return text[:1].upper() + text[1:]

    options = [
        click.option(
            "--ensemble",
            "ensemble",
            multiple=True,
            type=click.Path(exists=True),
            help=sentence(
                f"{subject}another model (repeatable; e.g. MODEL's int8 twin model_dynamic.onnx) whose "
                "probabilities are averaged with MODEL's, each under the same policy."
            ),
        ),
        click.option(
            "--iterate",
            type=click.IntRange(min=1),
            default=None,
            help=sentence(
                f"{subject}iterative inference: up to N steps, each step's --feedback outputs fed back as "
                f"inputs ({start}); the first fed-back output is the prediction."
            ),
        ),
        click.option(
            "--feedback", default="", help="--iterate: OUTPUT:INPUT pairs, comma separated (logits:prev)."
        ),
        click.option(
            "--loop",
            type=click.Choice(list(LOOPS)),
            default="external",
            show_default=True,
            help="--iterate: one session run per step (external), or every step in one ONNX Loop (onnx).",
        ),
        click.option(
            "--tol",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="--iterate: stop when the largest change of a fed-back value is below this.",
        ),
    ]

    return stacked(options)


def iteration_from(iterate: int | None, feedback: str, loop: str, tol: float | None) -> Iteration | None:
    """The :class:`Iteration` the options ask for; its options without ``--iterate N`` are refused."""
    if iterate is None:
        if feedback or tol is not None or loop != "external":
            raise ConfigError("--feedback, --loop and --tol need --iterate N", hint="add --iterate N (steps)")
        return None
    return Iteration.parse(iterate, feedback, loop, tol)
