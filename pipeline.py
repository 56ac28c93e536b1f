#!/usr/bin/env python
"""``python pipeline.py --model_type ... --dataset_path ...``: the training pipeline from the repository root.

A thin entry point over ``modelexport pipeline`` (same options, same exit codes); see
``python pipeline.py --help``.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from modelexport.cli.app import main
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))
    from modelexport.cli.app import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(["pipeline", *sys.argv[1:]], prog_name=f"python {Path(sys.argv[0]).name}"))
