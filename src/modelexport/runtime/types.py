"""ONNX Runtime's type strings (``NodeArg.type``) and the numpy dtypes they hold."""

from __future__ import annotations

__all__ = ["ORT_TO_NUMPY"]

ORT_TO_NUMPY: dict[str, str] = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int16)": "int16",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}
