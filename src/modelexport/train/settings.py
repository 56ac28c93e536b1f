"""The names of the pipeline's test-time settings, in a module light enough for ``--help`` (no dspy, torch)."""

from __future__ import annotations

__all__ = ["DEFAULT_MC_PASSES", "ENSEMBLES", "FALSE_WORDS", "SETTINGS", "TRUE_WORDS", "TTT_METHODS"]

#: Test-time training methods the pipeline offers (``--ttt bn|tent|sar``).
TTT_METHODS = ("bn", "tent", "sar")
#: The test-time settings a user may fix (the policy search decides the others).
SETTINGS = ("tta", "ttt", "mc_dropout", "ensemble")
#: ``--ensemble``: none, or the model with its int8 twin.
ENSEMBLES = ("none", "int8")
#: MC-dropout passes the policy search tries when ``--mc_dropout`` is left open.
DEFAULT_MC_PASSES = 8
#: How a boolean option may be written (click's words).
TRUE_WORDS = frozenset({"true", "1", "yes", "y", "on", "t"})
FALSE_WORDS = frozenset({"false", "0", "no", "n", "off", "f"})
