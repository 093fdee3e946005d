"""Units: dtype byte widths and the two gigabytes, always labelled.

Bytes are the unit inside vrammath. Published sources disagree on what "GB" means: ZeRO's Table 1
uses 1e9 bytes, DeepSpeed's estimators divide by 2**30 yet print "GB". vrammath offers both and
labels each: GB = 1e9 bytes, GiB = 2**30 bytes.

Examples
========

>>> dtype_bytes("bf16")
2
>>> fmt_gb(120_000_000_000), fmt_gib(2**30 * 3)
('120.00 GB', '3.00 GiB')
>>> dtype_bytes("fp8")
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: dtype: must be one of fp32, tf32, fp16, bf16, int8, fp8-e4m3, fp8-e5m2, int4, nf4 (got 'fp8')
"""

from __future__ import annotations

from fractions import Fraction

from vrammath.notation.errors import InputError, one_of

GB = 10**9
GiB = 2**30
MiB = 2**20

_DTYPES: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "tf32": Fraction(4),  # stored as fp32; TF32 is a matmul mode, not a storage format
    "fp16": Fraction(2),
    "bf16": Fraction(2),
    "int8": Fraction(1),
    "fp8-e4m3": Fraction(1),
    "fp8-e5m2": Fraction(1),
    "int4": Fraction(1, 2),
    "nf4": Fraction(1, 2),
}
DTYPES = tuple(_DTYPES)


def dtype_bytes(dtype: str) -> int | Fraction:
    """Bytes per element of a storage dtype (a Fraction for sub-byte formats)."""
    if dtype not in _DTYPES:
        raise one_of("dtype", dtype, DTYPES)
    value = _DTYPES[dtype]
    return int(value) if value.denominator == 1 else value


#: the largest byte count converted to a float (10**300; Python's floats end near 1.8e308)
MAX_BYTES = 10**300


def _finite(n_bytes: float) -> float:
    # A huge int would raise OverflowError in the division; refuse it by name instead.
    if isinstance(n_bytes, int) and abs(n_bytes) > MAX_BYTES:
        raise InputError("bytes", "must be at most 1e300 to convert to GB/GiB", got=n_bytes)
    return n_bytes


def to_gb(n_bytes: float) -> float:
    """Bytes to GB (1e9 bytes).

    >>> to_gb(10**310)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: bytes: must be at most 1e300 to convert to GB/GiB (got an integer of 1030 bits)
    """
    return _finite(n_bytes) / GB


def to_gib(n_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes)."""
    return _finite(n_bytes) / GiB


def fmt_gb(n_bytes: float, digits: int = 2) -> str:
    """``'12.34 GB'`` (decimal gigabytes, 1e9 bytes)."""
    return f"{to_gb(n_bytes):.{digits}f} GB"


def fmt_gib(n_bytes: float, digits: int = 2) -> str:
    """``'12.34 GiB'`` (binary gibibytes, 2**30 bytes)."""
    return f"{to_gib(n_bytes):.{digits}f} GiB"


def fmt_bytes(n_bytes: float) -> str:
    """Both units side by side: ``'85.90 GB / 80.00 GiB'``.

    >>> fmt_bytes(80 * 2**30)
    '85.90 GB / 80.00 GiB'
    """
    return f"{fmt_gb(n_bytes)} / {fmt_gib(n_bytes)}"


__all__ = [
    "DTYPES",
    "GB",
    "MAX_BYTES",
    "GiB",
    "MiB",
    "dtype_bytes",
    "fmt_bytes",
    "fmt_gb",
    "fmt_gib",
    "to_gb",
    "to_gib",
]
