/* golden_read.h: reading one scenario of a transformers golden file
 * (fixtures/hf/<family>/golden.h5, layout in fixtures/hf/README.md), shared
 * by tests/test_golden.c and tests/test_shadow64.c so both read the goldens
 * the same way. Failures are Check assertions (ck_assert), so these are for
 * Check tests only. */
#ifndef KV_GOLDEN_READ_H
#define KV_GOLDEN_READ_H

#include <hdf5.h>
#include <stdint.h>

/* One scenario as transformers decoded it; arrays malloc'd, row-major. */
typedef struct {
    char name[64];
    int64_t batch, prompt_len, steps, vocab;
    int32_t *input_ids; /* (B, P) */
    uint8_t *mask;      /* (B, P) */
    int32_t *tokens;    /* (N, B) */
    float *logits;      /* (N, B, V) */
    float *margins;     /* (N, B) */
} KvGolden;

/* Reads group /scenarios/<scenario> of the open file into *g, asserting
 * that every dataset is there, of the expected rank, and that the shapes
 * agree with each other. */
void kv_golden_read(hid_t file, const char *scenario, KvGolden *g);

/* Frees what kv_golden_read allocated and zeroes *g. */
void kv_golden_free(KvGolden *g);

/* Opens the golden file h5path read-only, with HDF5's own error printing
 * off (a failure is asserted here with the path), and lists its scenarios:
 * names gets the group names under /scenarios in name order, at most 16,
 * the slots after the last one empty. The caller closes the file. */
hid_t kv_golden_open(const char *h5path, char names[16][64]);

#endif
