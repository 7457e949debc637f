"""Golden .psk.d files written out by hand, byte by byte, and small helpers to put them on disk.

The layout: magic "PSKD", u16 version, u32 type length and the UTF-8 type, u64 count, [version 2: u32
leaves, one encoding byte a leaf], then the samples.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def h(text: str) -> bytes:
    """Hex with spaces, '|' and newlines for readability."""
    return bytes.fromhex(text.replace("|", " "))


def bits(array: np.ndarray) -> list:
    array = np.asarray(array)
    if array.dtype.kind == "f" or array.dtype == BF16:
        return array.view(f"<u{array.dtype.itemsize}").tolist()
    return array.tolist()


# --------------------------------------------------------------------------------------------
# Golden files, by hand

# ℝ[2] (written R[2]), 2 samples: [1.0, -2.0], [0.5, 3.0]
REAL2_V1 = h(
    "50 53 4b 44 | 01 00 | 06 00 00 00 | e2 84 9d 5b 32 5d | 02 00 00 00 00 00 00 00"
    "| 00 00 00 00 00 00 f0 3f | 00 00 00 00 00 00 00 c0"
    "| 00 00 00 00 00 00 e0 3f | 00 00 00 00 00 00 08 40"
)


# (idx[64][seq: 3], ℝ[]), 2 samples: ([1, 2, 3], 0.25), ([61, 62, 63], -0.0)
WINDOWS_V1 = h(
    "50 53 4b 44 | 01 00 | 18 00 00 00"
    "| 28 69 64 78 5b 36 34 5d 5b 73 65 71 3a 20 33 5d 2c 20 e2 84 9d 5b 5d 29"
    "| 02 00 00 00 00 00 00 00"
    "| 01 02 03 | 00 00 00 00 00 00 d0 3f"
    "| 3d 3e 3f | 00 00 00 00 00 00 00 80"
)


# idx[300][2] (u16), 2 samples: [0, 299], [256, 1]
IDX300 = h(
    "50 53 4b 44 | 01 00 | 0b 00 00 00 | 69 64 78 5b 33 30 30 5d 5b 32 5d | 02 00 00 00 00 00 00 00"
    "| 00 00 2b 01 | 00 01 01 00"
)


# idx[4294967297][] (2^32 + 1: u64), 2 samples: 4294967296, 7
IDX2_32_PLUS_1 = h(
    "50 53 4b 44 | 01 00 | 11 00 00 00 | 69 64 78 5b 34 32 39 34 39 36 37 32 39 37 5d 5b 5d"
    "| 02 00 00 00 00 00 00 00"
    "| 00 00 00 00 01 00 00 00 | 07 00 00 00 00 00 00 00"
)


# (ℝ[2], ℝ[2], idx[3][]) in f32, bf16, f64 (version 2), 1 sample: ([1.5, -0.375], [3.140625, -0.375], 2)
# f32 1.5 = 3fc00000, -0.375 = bec00000; bf16 = the upper halves: 3.140625 = 4049(0000), -0.375 = bec0
V2_F32_BF16 = h(
    "50 53 4b 44 | 02 00 | 1a 00 00 00"
    "| 28 e2 84 9d 5b 32 5d 2c 20 e2 84 9d 5b 32 5d 2c 20 69 64 78 5b 33 5d 5b 5d 29"
    "| 01 00 00 00 00 00 00 00 | 03 00 00 00 | 01 02 00"
    "| 00 00 c0 3f 00 00 c0 be | 49 40 c0 be | 02"
)


# bool[2], 2 samples: [true, false], [false, true]: idx[2], u8
BOOL2 = h(
    "50 53 4b 44 | 01 00 | 07 00 00 00 | 62 6f 6f 6c 5b 32 5d | 02 00 00 00 00 00 00 00 | 01 00 | 00 01"
)


def put(tmp_path, data: bytes, name: str = "x.psk.d"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# Every golden file above, by name.
GOLDEN = {"real": REAL2_V1, "windows": WINDOWS_V1, "idx300": IDX300, "idx64": IDX2_32_PLUS_1,
          "v2": V2_F32_BF16, "bool": BOOL2}
