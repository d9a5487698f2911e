"""FNV-1a 64 of byte rows, as the C side hashes logits and probe rows
(model/prng.c): offset basis 0xcbf29ce484222325, prime 0x100000001b3,
one byte at a time."""

import numpy as np

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def fnv1a64_rows(rows: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of each row's bytes (C order, the array's own dtype and
    byte order; callers pass little-endian float32). rows: (R, ...) -> (R,)
    uint64. The hash is serial in the bytes, so the loop runs over byte
    columns with every row at once."""
    r = np.ascontiguousarray(rows)
    n = r.shape[0]
    b = r.reshape(n, -1).view(np.uint8) if r.size else np.zeros((n, 0), np.uint8)
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(b.shape[1]):
            h ^= b[:, j].astype(np.uint64)
            h *= FNV_PRIME
    return h
