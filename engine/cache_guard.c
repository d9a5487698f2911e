/* cache_guard.c: sentinel-guarded buffers for the cache variants (cache.h).
 *
 * Every cache buffer (K, V, real flags, positions, temporaries) is wrapped in
 * KV_GUARD_FLOATS floats of a fixed bit pattern on each side, as ggml's
 * test-backend-ops does around every tensor: an update that writes one slot
 * too far (a window off by one, a shift of W + 1 rows, a prefill longer than
 * the window copied whole) lands in a guard, and sentinels_ok() reports it
 * after the step instead of silently corrupting a neighbour.
 *
 * Memory layout of one allocation (the usable pointer is 16-byte aligned, as
 * a vectorised kernel would assume):
 *
 *   [GuardHeader, padded to 16 bytes][front guard][usable bytes][back guard]
 *
 * The header records the usable size so kv_guard_ok() can find the back
 * guard. The back guard starts right after the last usable byte (not rounded
 * up), so even a one-byte overrun of a uint8_t buffer is seen; it is written
 * and compared bytewise for that reason. The usable bytes start out filled
 * with the same pattern: as floats it is a signalling NaN, so a read of a
 * never-written temporary shows up in the logits rather than as a plausible
 * zero. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

/* 0x7FBADBAD: exponent all ones, quiet bit clear, so a signalling NaN when
 * read as a float; distinctive in a hex dump. */
#define GUARD_WORD 0x7FBADBADu
/* Marks a live guarded allocation; cleared on free so a stale pointer fails
 * kv_guard_ok() instead of passing by luck. */
#define GUARD_MAGIC 0x6b76677561726421ULL /* "kvguard!" */
#define GUARD_ALIGN ((size_t)16)
#define GUARD_BYTES ((size_t)KV_GUARD_FLOATS * sizeof(float))

typedef struct {
    size_t bytes;   /* usable bytes */
    uint64_t magic; /* GUARD_MAGIC while allocated */
} GuardHeader;

/* The header slot is a multiple of the alignment so the usable pointer stays
 * aligned (GUARD_BYTES = 256 is one too). */
#define GUARD_HEADER_BYTES (((sizeof(GuardHeader) + GUARD_ALIGN - 1) / GUARD_ALIGN) * GUARD_ALIGN)

/* Fills n bytes at p with the guard word's bytes, in memory order, starting
 * at phase 0 of the word whatever p's alignment. */
static void guard_fill_pattern(unsigned char *p, size_t n) {
    const uint32_t word = GUARD_WORD;
    unsigned char b[sizeof word];
    memcpy(b, &word, sizeof word);
    for (size_t i = 0; i < n; i++) p[i] = b[i % sizeof word];
}

static bool guard_check_pattern(const unsigned char *p, size_t n) {
    const uint32_t word = GUARD_WORD;
    unsigned char b[sizeof word];
    memcpy(b, &word, sizeof word);
    for (size_t i = 0; i < n; i++) {
        if (p[i] != b[i % sizeof word]) return false;
    }
    return true;
}

static unsigned char *guard_base(const void *p) {
    return (unsigned char *)p - GUARD_BYTES - GUARD_HEADER_BYTES;
}

/* Returns NULL when out of memory or when the size with its guards would not
 * fit a size_t. bytes == 0 is allowed (a dynamic cache with W = 1 keeps no
 * slots): the two guards then touch. */
void *kv_guard_alloc(size_t bytes) {
    const size_t overhead = GUARD_HEADER_BYTES + 2 * GUARD_BYTES + GUARD_ALIGN;
    if (bytes > SIZE_MAX - overhead) return NULL;
    /* aligned_alloc wants a size that is a multiple of the alignment. */
    size_t total = GUARD_HEADER_BYTES + GUARD_BYTES + bytes + GUARD_BYTES;
    total = (total + GUARD_ALIGN - 1) / GUARD_ALIGN * GUARD_ALIGN;
    unsigned char *base = aligned_alloc(GUARD_ALIGN, total);
    if (base == NULL) return NULL;

    GuardHeader h = {.bytes = bytes, .magic = GUARD_MAGIC};
    memcpy(base, &h, sizeof h);
    unsigned char *front = base + GUARD_HEADER_BYTES;
    unsigned char *user = front + GUARD_BYTES; /* 16-byte aligned: base, header, guard all are */
    guard_fill_pattern(front, GUARD_BYTES);
    guard_fill_pattern(user, bytes); /* NaN poison until the owner writes it */
    guard_fill_pattern(user + bytes, GUARD_BYTES);
    return user;
}

void kv_guard_free(void *p) {
    if (p == NULL) return;
    unsigned char *base = guard_base(p);
    GuardHeader h;
    memcpy(&h, base, sizeof h);
    h.magic = 0;
    memcpy(base, &h, sizeof h);
    free(base);
}

/* False for NULL (there is no buffer to vouch for), for a header whose magic
 * is gone, and for any byte of either guard that differs from the pattern. */
bool kv_guard_ok(const void *p) {
    if (p == NULL) return false;
    const unsigned char *base = guard_base(p);
    GuardHeader h;
    memcpy(&h, base, sizeof h);
    if (h.magic != GUARD_MAGIC) return false;
    const unsigned char *user = (const unsigned char *)p;
    return guard_check_pattern(user - GUARD_BYTES, GUARD_BYTES) &&
           guard_check_pattern(user + h.bytes, GUARD_BYTES);
}
