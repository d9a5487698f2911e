/* backend_rows.h: rows at their own positions (DESIGN §2: a right-padded
 * batch) over any backend, as one single-row run of that backend per row.
 *
 * Each forward feeds row b's run only the row's position-taking tokens
 * (its left pads and real tokens; a trailing pad takes no slot and no
 * position), so row b's run performs exactly the work of the row decoded
 * alone with the same chunks: "every row is bitwise the row alone" holds by
 * construction, for every variant and mode, also on a device whose library
 * picks its kernels by the number of rows (cuBLAS). The CUDA backend runs
 * rows at their own positions this way (cuda_backend.cu); the CPU reference
 * has its own per-row mode, and test_backend_rows runs this adapter over
 * the CPU backend and requires it to equal that mode bitwise, which proves
 * the adapter's bookkeeping on a machine without a GPU.
 *
 * A row with no position-taking token in a forward (a chunk of only
 * trailing pads) does not run and keeps its outputs, as on the CPU. The
 * planted pad_slots (fault.h) feeds the trailing pads too, as pad slots.
 * In graph mode each row run captures and replays its own graph; a replay
 * whose rows feed other token counts than at capture is refused (a decode
 * step feeds every row one token, so only a forced script could). */
#ifndef KV_BACKEND_ROWS_H
#define KV_BACKEND_ROWS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

typedef struct KvRows KvRows;

/* Creates row b's single-row run (setup one: batch 1, per_row false).
 * first is row 0's run (NULL for row 0): a backend may share read-only
 * parts with it (the CUDA backend borrows its device weights), and then
 * row 0 is destroyed last. NULL: inner->create. */
typedef KvStatus (*KvRowsCreateRow)(const KvModel *m, const KvBackendSetup *one,
                                    KvBackend *first, KvBackend **out, KvError *err);

/* One run of setup->batch rows over inner; create_row may be NULL. */
KvStatus kv_rows_create(const KvBackendOps *inner, KvRowsCreateRow create_row, const KvModel *m,
                        const KvBackendSetup *setup, KvRows **out, KvError *err);
void kv_rows_destroy(KvRows *rows); /* NULL-safe */
/* The entries of backend.h, over the rows: */
KvStatus kv_rows_set_input(KvRows *rows, const int32_t *tokens /* (B, n) */,
                           const uint8_t *real /* (B, n) */, int64_t n, KvError *err);
KvStatus kv_rows_forward(KvRows *rows, int64_t n, KvError *err);
/* The rows' keys summed (each row's regime and attended length only grow
 * in a decode, so the sum changes exactly when one of them does). */
void kv_rows_layer_key(const KvRows *rows, int64_t layer, int64_t n, int64_t *regime,
                       int64_t *slots);
KvStatus kv_rows_capture(KvRows *rows, int64_t n, KvError *err);
KvStatus kv_rows_replay(KvRows *rows, KvError *err);
KvStatus kv_rows_snapshot(KvRows *rows, int slot, bool save, KvError *err);
KvStatus kv_rows_read_step(KvRows *rows, KvBackendStep *out, KvError *err);
/* The first non-finite probe value of the row runs (lowest probe, then
 * row), every row's record forgotten; false when none, or when inner has no
 * take_nonfinite. */
bool kv_rows_take_nonfinite(KvRows *rows, KvNonfinite *out);
/* The row runs' stats: counters summed, device and math mode row 0's. */
void kv_rows_stats(const KvRows *rows, KvBackendStats *out);

#endif
