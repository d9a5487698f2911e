"""FNV-1a 64 of byte rows, as the C side hashes logits and probe rows
(model/prng.c): offset basis 0xcbf29ce484222325, prime 0x100000001b3,
one byte at a time."""

import numpy as np

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


# At most this many rows are hashed one row at a time in Python integers
# (~0.1 us a byte) rather than one byte column at a time over all rows in
# numpy (a few us a column whatever the rows): a capture's second hashing
# level is a row or two of tens of thousands of bytes (probe_row_hashes).
FEW_ROWS = 16
_MASK = (1 << 64) - 1


def fnv1a64_rows(rows: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of each row's bytes (C order, the array's own dtype and
    byte order; callers pass little-endian float32). rows: (R, ...) -> (R,)
    uint64. The hash is serial in the bytes, so the loop runs over byte
    columns with every row at once, or, for at most FEW_ROWS rows, over
    each row's bytes (the same hash, faster where a column holds few rows)."""
    r = np.ascontiguousarray(rows)
    n = r.shape[0]
    b = r.reshape(n, -1).view(np.uint8) if r.size else np.zeros((n, 0), np.uint8)
    if n <= FEW_ROWS:
        out = np.empty(n, np.uint64)
        prime = int(FNV_PRIME)
        for i in range(n):
            h = int(FNV_OFFSET)
            for byte in b[i].tobytes():
                h = ((h ^ byte) * prime) & _MASK
            out[i] = h
        return out
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(b.shape[1]):
            h ^= b[:, j].astype(np.uint64)
            h *= FNV_PRIME
    return h
