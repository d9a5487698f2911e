/* golden.h: the reference itself judged against transformers (DESIGN §6,
 * "the reference is judged too"). Every candidate is held to the reference
 * and shares its forward pass, so a bug in the reference (a RoPE sign, a
 * norm's (1 + w), a window one too narrow) moves every run alike and no
 * candidate comparison can see it. The gate therefore first decodes each
 * family's committed transformers goldens (fixtures/hf/<family>/golden.h5,
 * layout in fixtures/hf/README.md) with the reference, teacher-forced with
 * transformers' tokens, and compares: comparison kind `golden`. */
#ifndef KV_GOLDEN_H
#define KV_GOLDEN_H

#include <stdbool.h>
#include <stdint.h>

#include "matrix.h"
#include "report.h"
#include "status.h"

/* fp32 against fp32 with other reduction orders (torch's blocked matmuls
 * against the reference's lanes) differs by a few ULP of the largest logit,
 * ~1e-6 relative; 1e-5 leaves room over a 40-step decode and still fails
 * every semantic change of the reference (they move logits by 1e-2 and
 * more). */
#define KV_GOLDEN_MAX_REL_ERR 1e-5
/* Below this margin (absolute; logits are O(1..10)) fp32 rounding may flip
 * the greedy token legitimately: ~100x the largest absolute logit error. */
#define KV_GOLDEN_TIE_MARGIN 1e-4
/* Headroom over the triangle bound (both yardsticks are maxima over the
 * batch, measured once). */
#define KV_GOLDEN_BOUND_MULT 2.0
/* Scenarios one golden file may hold (the regenerate script writes 6). */
#define KV_GOLDEN_MAX_SCENARIOS 16

/* One scenario as transformers decoded it; arrays malloc'd, row-major. */
typedef struct {
    char name[64];
    int64_t batch, prompt_len, steps, vocab;
    int32_t *input_ids; /* (B, P) left-padded */
    uint8_t *mask;      /* (B, P) 1 = real token */
    int32_t *tokens;    /* (N, B) transformers' greedy tokens */
    float *logits;      /* (N, B, V) */
    float *margins;     /* (N, B) top-1 minus top-2 logit */
    double fp64_rel_err; /* the golden's own fp32 error against the same model in
                          * float64 (attribute fp64_rel_err), or -1 where absent */
} KvGoldenScenario;

typedef struct {
    KvGoldenScenario sc[KV_GOLDEN_MAX_SCENARIOS];
    int n;
} KvGoldenFile;

/* Reads every scenario of a golden file (KV_ERR_INPUT naming the file, the
 * object and what is wrong: a missing dataset, a wrong rank or type, shapes
 * that disagree, a size beyond the report limits). */
KvStatus kv_golden_load(const char *path, KvGoldenFile *g, KvError *err);
void kv_golden_file_free(KvGoldenFile *g);

/* The goldens' root: $KVREPRO_SOURCE_DIR/fixtures/hf when set (a bundled
 * binary on another machine), else this source tree's. */
void kv_golden_default_root(char *out, size_t n);

/* One golden unit of the gate: the family's checkpoint root/<family> is
 * loaded, each scenario of its golden.h5 becomes a run of transformers'
 * outputs (model "hf/<family>", variant "transformers") and a CPU reference
 * run teacher-forced with its tokens (variant "reference"), and the two are
 * compared (KV_CMP_GOLDEN, by outputs, tie-aware, at every step of every
 * row: both were fed the same tokens) with the golden tolerances. Appended
 * to rep; *judged counts the comparisons made. */
KvStatus kv_gate_run_golden(const char *root, const char *family, const KvGateOptions *o,
                            KvReport *rep, int64_t *judged, KvError *err);

/* The same for any checkpoint directory and golden file (`kvrepro gate
 * --model DIR --golden FILE`), with the tolerances given; the runs are
 * named model_name. A scenario that records its own fp64 error
 * (fp64_rel_err) is judged by a measured bound instead of tol's
 * max_rel_err (unless o->tol_max_rel_err_set): the reference's error
 * against its fp64 shadow (itself a comparison, KV_CMP_SHADOW) plus the
 * golden's against transformers in float64, by the triangle inequality
 * |ref - hf| <= |ref - exact| + |hf - exact|, times KV_GOLDEN_BOUND_MULT,
 * never below tol's; a reference beyond KV_FP64_MAX_REL_ERR of its shadow
 * fails that comparison and lends nothing (the floor). The two yardsticks are independent: a semantic bug
 * the shadow shares with the reference leaves both small. A vocabulary
 * above o->full_logits_max_vocab keeps top-k in the report once every
 * comparison has seen the full rows. */
KvStatus kv_gate_run_golden_at(const char *dir, const char *path, const char *model_name,
                               const KvGateOptions *o, const KvTolerances *tol, KvReport *rep,
                               int64_t *judged, KvError *err);

#endif
