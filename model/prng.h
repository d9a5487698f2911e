/* prng.h: kvrepro's own pseudo-random generator, used for fixture weights and
 * prompts so that a seed gives the same model on every machine.
 *
 * Generator: SplitMix64 (Steele, Lea, Flood 2014). state += 0x9E3779B97F4A7C15;
 * z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 * z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31).
 * Streams: kv_prng_stream(seed, name) seeds a generator from the seed and the
 * FNV-1a hash of a name (e.g. a tensor name), so each tensor's values do not
 * depend on which other tensors exist or in what order they are generated.
 * Floats: the top 24 bits of a draw, u = (z >> 40) * 2^-24 in [0, 1). */
#ifndef KV_PRNG_H
#define KV_PRNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t state;
} KvPrng;

KvPrng kv_prng_seed(uint64_t seed);
KvPrng kv_prng_stream(uint64_t seed, const char *name);
uint64_t kv_prng_next(KvPrng *g);
/* Uniform in [0, 1), 24-bit resolution (exact in F32). */
float kv_prng_uniform(KvPrng *g);
/* Uniform integer in [0, n), n >= 1 (multiply-shift, bias < 2^-32). */
uint32_t kv_prng_below(KvPrng *g, uint32_t n);

/* FNV-1a 64-bit over n bytes, continuing from h (start with KV_FNV_OFFSET). */
#define KV_FNV_OFFSET 0xcbf29ce484222325ULL
uint64_t kv_fnv1a(uint64_t h, const void *data, size_t n);
/* Four kv_fnv1a chains side by side over four buffers of n bytes each:
 * h[j] = kv_fnv1a(h[j], data[j], n). FNV-1a is one multiply per byte, each
 * waiting on the last; four independent chains keep the multiplier busy,
 * with the same bits as four calls. */
void kv_fnv1a_x4(uint64_t h[4], const void *const data[4], size_t n);

#endif
