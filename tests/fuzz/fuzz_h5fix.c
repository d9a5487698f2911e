/* fuzz_h5fix.c: see fuzz_h5fix.h.
 *
 * Layouts from the HDF5 File Format Specification, version 2/3 structures:
 *  - superblock v2/v3: signature (8), version, size of offsets O, size of
 *    lengths L, flags, 4 addresses of O bytes, checksum of all that;
 *  - object header v2 ("OHDR"): version 2, flags (bits 0-1: width of the
 *    chunk-0 size; bit 2: message creation order stored; bit 4: attribute
 *    phase change values stored; bit 5: times stored), [4 times x 4],
 *    [2 x 2], chunk-0 size, the messages, checksum of everything before it;
 *  - continuation chunk ("OCHK"): signature, messages, checksum; its
 *    address and length are in a continuation message (type 0x10: offset O,
 *    length L) of an earlier chunk.
 * Messages: type (1), data size (2), flags (1), [creation order (2)], data. */
#include "fuzz_h5fix.h"

#include <string.h>

/* libhdf5's own metadata checksum (Jenkins lookup3), exported since 1.8.7
 * though declared only in its private headers. */
uint32_t H5_checksum_metadata(const void *data, size_t len, uint32_t initval);

#define KV_H5_MAX_CONTINUATIONS 256

typedef struct {
    uint64_t addr, len;
} Continuation;

typedef struct {
    uint8_t *data;
    size_t size;
    unsigned offset_size, length_size;
    uint64_t base;
    Continuation cont[KV_H5_MAX_CONTINUATIONS];
    size_t n_cont;
} FixCtx;

static uint64_t read_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;) v = (v << 8) | p[i];
    return v;
}

static void write_checksum(uint8_t *at, uint32_t sum) {
    for (int i = 0; i < 4; i++) at[i] = (uint8_t)(sum >> (8 * i));
}

/* Walks the messages in [p, end) and records continuation messages. */
static void scan_messages(FixCtx *c, const uint8_t *p, const uint8_t *end, bool creation_order) {
    const size_t head = creation_order ? 6 : 4;
    while ((size_t)(end - p) >= head) {
        unsigned type = p[0];
        size_t msize = (size_t)read_le(p + 1, 2);
        p += head;
        if (msize > (size_t)(end - p)) return;
        if (type == 0x10 && msize >= c->offset_size + c->length_size &&
            c->n_cont < KV_H5_MAX_CONTINUATIONS) {
            Continuation *k = &c->cont[c->n_cont++];
            k->addr = read_le(p, c->offset_size);
            k->len = read_le(p + c->offset_size, c->length_size);
        }
        p += msize;
    }
}

/* Fixes the object header v2 at offset off; false when it is not one. */
static bool fix_ohdr(FixCtx *c, size_t off) {
    uint8_t *h = c->data + off;
    size_t avail = c->size - off;
    if (avail < 7 || memcmp(h, "OHDR", 4) != 0 || h[4] != 2) return false;
    uint8_t flags = h[5];
    size_t pos = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
    unsigned width = 1u << (flags & 3);
    if (avail < pos + width) return false;
    uint64_t chunk = read_le(h + pos, width);
    pos += width;
    if (chunk > avail || avail - chunk < pos + 4) return false;
    scan_messages(c, h + pos, h + pos + chunk, (flags & 0x04) != 0);
    size_t sum_at = pos + (size_t)chunk;
    write_checksum(h + sum_at, H5_checksum_metadata(h, sum_at, 0));
    return true;
}

void kv_fuzz_h5_fix_checksums(uint8_t *data, size_t size) {
    static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    static FixCtx c; /* large; one fuzzing thread */
    memset(&c, 0, sizeof c);
    c.data = data;
    c.size = size;
    /* The superblock: at 0 here (a user block would move it to 512, ...). */
    if (size < 12 || memcmp(data, sig, 8) != 0 || (data[8] != 2 && data[8] != 3)) return;
    c.offset_size = data[9];
    c.length_size = data[10];
    if ((c.offset_size != 4 && c.offset_size != 8) || (c.length_size != 4 && c.length_size != 8)) {
        return;
    }
    size_t sb_len = 12 + 4 * (size_t)c.offset_size;
    if (size < sb_len + 4) return;
    c.base = read_le(data + 12, c.offset_size);
    write_checksum(data + sb_len, H5_checksum_metadata(data, sb_len, 0));

    /* Every object header, wherever the mutations put it. */
    bool creation_order = false;
    for (size_t off = sb_len + 4; off + 4 <= size; off++) {
        if (data[off] == 'O' && fix_ohdr(&c, off)) {
            creation_order = creation_order || (data[off + 5] & 0x04) != 0;
        }
    }
    /* Continuation chunks named by the headers (and by each other). */
    for (size_t k = 0; k < c.n_cont; k++) {
        uint64_t addr = c.cont[k].addr + c.base, len = c.cont[k].len;
        if (addr < c.cont[k].addr || addr >= size || len < 8 || len > size - addr) continue;
        uint8_t *p = data + addr;
        if (memcmp(p, "OCHK", 4) != 0) continue;
        scan_messages(&c, p + 4, p + len - 4, creation_order);
        write_checksum(p + len - 4, H5_checksum_metadata(p, (size_t)len - 4, 0));
    }
}
