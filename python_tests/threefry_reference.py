"""An independent numpy Threefry-2x32-20 and the compiled dropout's documented mask layout: the
reference of the dropout op (test_dropout.py) and of the fused quadratic attention's masks."""

import numpy as np

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_MASK32 = np.uint64(0xFFFFFFFF)


def threefry2x32_20(counter: np.ndarray, key: int) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Salmon et al. 2011): the two output words for each 64-bit
    counter (low word first) under the 64-bit key (low word first), as uint64 arrays < 2³²."""
    k = [key & 0xFFFFFFFF, key >> 32]
    k.append(0x1BD11BDA ^ k[0] ^ k[1])
    ks = [np.uint64(v) for v in k]
    x0 = ((counter & _MASK32) + ks[0]) & _MASK32
    x1 = ((counter >> np.uint64(32)) + ks[1]) & _MASK32
    for r in range(20):
        x0 = (x0 + x1) & _MASK32
        rot = np.uint64(_ROTATIONS[r % 8])
        x1 = (((x1 << rot) | (x1 >> (np.uint64(32) - rot))) & _MASK32) ^ x0
        if r % 4 == 3:
            s = r // 4 + 1
            x0 = (x0 + ks[s % 3]) & _MASK32
            x1 = (x1 + ks[(s + 1) % 3] + np.uint64(s)) & _MASK32
    return x0, x1


def reference_keep(n: int, p: float, seed: int) -> np.ndarray:
    """The op's documented mask over ``n`` elements in memory order: element ``64 b + 32 w + l``
    takes word ``w`` at counter ``32 b + l``, kept iff it is below ``min(floor((1 - p) 2³²),
    2³² - 1)``."""
    i = np.arange(n, dtype=np.uint64)
    block, rest = i // np.uint64(64), i % np.uint64(64)
    words = threefry2x32_20(block * np.uint64(32) + rest % np.uint64(32), seed % 2**64)
    word = np.where(rest < np.uint64(32), words[0], words[1])
    return word < np.uint64(min(int(np.floor((1.0 - p) * 2.0**32)), 2**32 - 1))
