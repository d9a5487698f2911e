/* prng.c: SplitMix64 streams and FNV-1a hashing (see prng.h for the exact
 * definitions; they are part of the fixture format, so never change them
 * without changing every committed golden). */
#include "prng.h"

uint64_t kv_fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void kv_fnv1a_x4(uint64_t h[4], const void *const data[4], size_t n) {
    const uint8_t *p0 = data[0], *p1 = data[1], *p2 = data[2], *p3 = data[3];
    uint64_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (size_t i = 0; i < n; i++) {
        a = (a ^ p0[i]) * 0x100000001b3ULL;
        b = (b ^ p1[i]) * 0x100000001b3ULL;
        c = (c ^ p2[i]) * 0x100000001b3ULL;
        d = (d ^ p3[i]) * 0x100000001b3ULL;
    }
    h[0] = a;
    h[1] = b;
    h[2] = c;
    h[3] = d;
}

KvPrng kv_prng_seed(uint64_t seed) {
    KvPrng g = {seed};
    return g;
}

KvPrng kv_prng_stream(uint64_t seed, const char *name) {
    uint64_t h = KV_FNV_OFFSET;
    for (const char *c = name; *c != '\0'; c++) h = kv_fnv1a(h, c, 1);
    /* Mix the seed through one SplitMix64 step first so seeds 1 and 2 do not
     * give streams that differ only by a constant. */
    KvPrng g = {seed};
    uint64_t s = kv_prng_next(&g);
    KvPrng out = {s ^ h};
    return out;
}

uint64_t kv_prng_next(KvPrng *g) {
    g->state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = g->state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

float kv_prng_uniform(KvPrng *g) {
    /* 24 bits: every value is exactly representable in F32. */
    return (float)(kv_prng_next(g) >> 40) * (1.0f / 16777216.0f);
}

uint32_t kv_prng_below(KvPrng *g, uint32_t n) {
    uint64_t r = kv_prng_next(g) >> 32;
    return (uint32_t)((r * (uint64_t)n) >> 32);
}
