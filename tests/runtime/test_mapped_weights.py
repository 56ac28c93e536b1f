"""External data as ONNX Runtime maps it: gathering rows of an embedding table that ``save_onnx`` wrote keeps
the session's resident memory at the rows it reads.

A filesystem with large folios (ext4 and XFS on Linux 6.x) caches a file in folios as large as the writes
that made it, up to 2 MB, and the kernel maps a whole folio into a process that touches one byte of it: a
table written in one piece (``onnx.save_model``'s single write per tensor) costs its reader 2 MB per gathered
row. The control file measures whether this machine's filesystem does that; where it does not, there is
nothing to measure and the test skips.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelexport.onnxfile import save_onnx
from modelexport.runtime import SessionConfig, create_session

ROWS, WIDTH = 8192, 1024  # a 32 MB float32 table: sixteen 2 MB folios when written in one piece
FOLIO_ROWS = (2 << 20) // (WIDTH * 4)  # rows per 2 MB
GATHERED = np.arange(ROWS // FOLIO_ROWS, dtype=np.int64) * FOLIO_ROWS  # one row in every 2 MB


def _gather_model() -> onnx.ModelProto:
    table = np.random.default_rng(0).standard_normal((ROWS, WIDTH)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n", WIDTH])],
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _mapped_mb(data_file: Path) -> float:
    """Resident MB of this process's mappings of ``data_file``."""
    kb, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
            inside = len(head) >= 6 and head[5] == str(data_file)
        elif inside and line.startswith("Rss:"):
            kb += int(head[1])
    return kb / 1024


def _resident_after_gather(model_path: Path) -> float:
    session, _ = create_session(model_path, SessionConfig(intra_op_num_threads=1))
    rows = session.run(None, {"ids": GATHERED})[0]
    assert rows.shape == (len(GATHERED), WIDTH)
    resident = _mapped_mb(model_path.with_name(f"{model_path.name}.data").resolve())
    del session
    return resident


@pytest.mark.regression
def test_gathered_rows_of_saved_external_data_map_only_what_they_read(tmp_path: Path) -> None:
    if not Path("/proc/self/smaps").is_file():
        pytest.skip("needs Linux's /proc/self/smaps")
    ours = save_onnx(_gather_model(), tmp_path / "ours" / "model.onnx", external_data=True)
    control = tmp_path / "one_write" / "model.onnx"
    control.parent.mkdir()
    onnx.save_model(_gather_model(), str(control), save_as_external_data=True, location="model.onnx.data")
    one_piece, pieces = _resident_after_gather(control), _resident_after_gather(ours)
    if one_piece < 16:
        pytest.skip(f"this filesystem caches no large folios ({one_piece:.1f} MB mapped for 16 rows)")
    # 16 rows of 4 KB: a 64 KiB piece each at most (+ ORT's own reads), against 2 MB each in one piece
    assert pieces <= 4, (pieces, one_piece)
