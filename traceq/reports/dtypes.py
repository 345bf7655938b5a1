"""dtypes as people write them: the profiler's `c10::BFloat16`, `c10::Half` and `float`
shown as `bf16`, `fp16`, `fp32`. One mapping for every report that shows a finding's dtype
(text, Markdown, HTML); JSON keeps the trace's own spelling and adds this one beside it."""

from __future__ import annotations

#: The profiler's `Input type` spellings -> short names.
DTYPE_NAMES: dict[str, str] = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8e4m3",
    "c10::Float8_e5m2": "fp8e5m2",
    "c10::Float8_e4m3fnuz": "fp8e4m3fnuz",
    "c10::Float8_e5m2fnuz": "fp8e5m2fnuz",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short int": "int16",
    "int": "int32",
    "long int": "int64",
    "bool": "bool",
}


def dtype_name(dtype: str | None) -> str:
    """`c10::BFloat16` -> `bf16`; a spelling not in `DTYPE_NAMES` as it is ("" for None)."""
    if not dtype:
        return ""
    return DTYPE_NAMES.get(dtype, dtype)
