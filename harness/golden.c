/* golden.c: the reference judged against transformers' committed goldens
 * (golden.h). */
#include "golden.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "model.h"
#include "scenario.h"
#include "shadow64.h"

/* A golden holds tiny decodes: far below this many logits per scenario. */
#define KV_GOLDEN_MAX_ELEMS ((hsize_t)1 << 26)

void kv_golden_file_free(KvGoldenFile *g) {
    for (int i = 0; i < g->n; i++) {
        KvGoldenScenario *s = &g->sc[i];
        free(s->input_ids);
        free(s->mask);
        free(s->tokens);
        free(s->logits);
        free(s->margins);
    }
    memset(g, 0, sizeof *g);
}

void kv_golden_default_root(char *out, size_t n) {
    const char *root = getenv("KVREPRO_SOURCE_DIR");
    snprintf(out, n, "%s/fixtures/hf", root != NULL && root[0] != '\0' ? root : KV_SOURCE_DIR);
}

/* Dataset `name` of group gid, of rank `rank`, read as mem_type into a
 * malloc'd *buf; dims receives its shape. */
static KvStatus golden_dataset(hid_t gid, const char *path, const char *group, const char *name,
                               hid_t mem_type, size_t elem, int rank, hsize_t *dims, void **buf,
                               KvError *err) {
    KvStatus st = KV_OK;
    hid_t d = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    *buf = NULL;
    if (H5Lexists(gid, name, H5P_DEFAULT) <= 0 || (d = H5Dopen2(gid, name, H5P_DEFAULT)) < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: %s/%s: dataset missing", path, group, name);
        goto cleanup;
    }
    sp = H5Dget_space(d);
    if (sp < 0 || H5Sget_simple_extent_ndims(sp) != rank) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: %s/%s: expected rank %d", path, group, name,
                          rank);
        goto cleanup;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    hsize_t count = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > KV_GOLDEN_MAX_ELEMS / count) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: %s/%s: empty or too large (dimension %d "
                              "is %llu)", path, group, name, i, (unsigned long long)dims[i]);
            goto cleanup;
        }
        count *= dims[i];
    }
    *buf = malloc((size_t)count * elem);
    if (*buf == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    if (H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *buf) < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: %s/%s: cannot be read as %s", path, group,
                          name, mem_type == H5T_NATIVE_FLOAT ? "float32" : "integers");
    }
cleanup:
    if (st != KV_OK) {
        free(*buf);
        *buf = NULL;
    }
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
    return st;
}

/* Reads /scenarios/<name> into *s and checks its shapes agree. */
static KvStatus golden_scenario(hid_t file, const char *path, const char *name,
                                KvGoldenScenario *s, KvError *err) {
    char group[128];
    snprintf(group, sizeof group, "/scenarios/%.100s", name);
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%.63s", name);
    hid_t gid = H5Gopen2(file, group, H5P_DEFAULT);
    if (gid < 0) return kv_error_set(err, KV_ERR_INPUT, "%s: %s: not a group", path, group);
    hsize_t di[2], dm[2], dt[2], dl[3], dg[2];
    void *p[5] = {NULL, NULL, NULL, NULL, NULL};
    KvStatus st = golden_dataset(gid, path, group, "input_ids", H5T_NATIVE_INT32, 4, 2, di, &p[0],
                                 err);
    if (st == KV_OK) {
        st = golden_dataset(gid, path, group, "attention_mask", H5T_NATIVE_UINT8, 1, 2, dm, &p[1],
                            err);
    }
    if (st == KV_OK) {
        st = golden_dataset(gid, path, group, "tokens", H5T_NATIVE_INT32, 4, 2, dt, &p[2], err);
    }
    if (st == KV_OK) {
        st = golden_dataset(gid, path, group, "logits", H5T_NATIVE_FLOAT, 4, 3, dl, &p[3], err);
    }
    if (st == KV_OK) {
        st = golden_dataset(gid, path, group, "margins", H5T_NATIVE_FLOAT, 4, 2, dg, &p[4], err);
    }
    s->fp64_rel_err = -1.0;
    if (st == KV_OK && H5Aexists(gid, "fp64_rel_err") > 0) {
        hid_t at = H5Aopen(gid, "fp64_rel_err", H5P_DEFAULT);
        double v = -1.0;
        if (at < 0 || H5Aread(at, H5T_NATIVE_DOUBLE, &v) < 0 || !(v >= 0.0 && v < 1.0)) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: %s: attribute fp64_rel_err: expected a "
                              "relative error in [0, 1)", path, group);
        }
        if (at >= 0) H5Aclose(at);
        s->fp64_rel_err = v;
    }
    H5Gclose(gid);
    s->input_ids = p[0];
    s->mask = p[1];
    s->tokens = p[2];
    s->logits = p[3];
    s->margins = p[4];
    if (st != KV_OK) return st;
    s->batch = (int64_t)di[0];
    s->prompt_len = (int64_t)di[1];
    s->steps = (int64_t)dl[0];
    s->vocab = (int64_t)dl[2];
    if (dm[0] != di[0] || dm[1] != di[1] || dt[0] != dl[0] || dt[1] != di[0] ||
        dl[1] != di[0] || dg[0] != dl[0] || dg[1] != di[0]) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: %s: the shapes of input_ids, "
                            "attention_mask, tokens, logits and margins disagree", path, group);
    }
    return KV_OK;
}

/* H5Literate callback: collects group names into a KvGoldenFile's names. */
typedef struct {
    char names[KV_GOLDEN_MAX_SCENARIOS][64];
    int n;
    bool overflow;
} GoldenNames;

static herr_t golden_collect(hid_t g, const char *name, const H5L_info_t *info, void *op) {
    (void)g;
    (void)info;
    GoldenNames *gn = op;
    if (gn->n == KV_GOLDEN_MAX_SCENARIOS) {
        gn->overflow = true;
        return 1;
    }
    snprintf(gn->names[gn->n++], 64, "%.63s", name);
    return 0;
}

KvStatus kv_golden_load(const char *path, KvGoldenFile *g, KvError *err) {
    memset(g, 0, sizeof *g);
    H5E_auto2_t old_fn = NULL;
    void *old_data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &old_fn, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* failures are reported here, with the path */
    KvStatus st = KV_OK;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), sg = H5I_INVALID_HID;
    GoldenNames gn;
    memset(&gn, 0, sizeof gn);
    if (f < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot open the transformers golden (pass "
                          "--goldens DIR, or --no-goldens to gate without judging the "
                          "reference against transformers)", path);
        goto cleanup;
    }
    sg = H5Gopen2(f, "/scenarios", H5P_DEFAULT);
    if (sg < 0 || H5Literate(sg, H5_INDEX_NAME, H5_ITER_INC, NULL, golden_collect, &gn) < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: /scenarios: missing or unreadable", path);
        goto cleanup;
    }
    if (gn.overflow || gn.n == 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: /scenarios: expected 1 to %d scenarios, found "
                          "%s", path, KV_GOLDEN_MAX_SCENARIOS, gn.n == 0 ? "none" : "more");
        goto cleanup;
    }
    for (int i = 0; i < gn.n && st == KV_OK; i++) {
        st = golden_scenario(f, path, gn.names[i], &g->sc[i], err);
        g->n = i + 1;
    }
cleanup:
    if (sg >= 0) H5Gclose(sg);
    if (f >= 0) H5Fclose(f);
    H5Eset_auto2(H5E_DEFAULT, old_fn, old_data);
    if (st != KV_OK) kv_golden_file_free(g);
    return st;
}

/* transformers' decode of scenario s as a run of rep: a decode result
 * without probes, graphs or replays (its tokens, logits and margins moved
 * out of s). cfg: the checkpoint's. */
static KvStatus golden_run(KvGoldenScenario *s, const KvConfig *cfg, const char *model_name,
                           const char *path, KvReport *rep, int64_t *idx, KvError *err) {
    *idx = kv_gate_add_run(rep);
    if (*idx < 0) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    KvRun *r = &rep->runs[*idx];
    kv_run_identify(r, model_name, s->name, "transformers", "torch-cpu", "eager", 0, 0);
    snprintf(r->engine, sizeof r->engine, "transformers golden %.200s", path);
    const KvDecodeSpec spec = {.batch = s->batch, .prompt_len = s->prompt_len,
                               .prompt = s->input_ids, .prompt_real = s->mask,
                               .new_tokens = s->steps};
    KvDecodeResult res = {.steps = s->steps, .batch = s->batch, .vocab = s->vocab,
                          .tokens = s->tokens, .logits = s->logits, .margins = s->margins,
                          .replay_mismatch_step = -1, .nonfinite_step = -1,
                          .nonfinite_probe = -1, .nonfinite_row = -1, .nonfinite_index = -1};
    s->tokens = NULL;
    s->logits = NULL;
    s->margins = NULL;
    return kv_run_from_result(r, cfg, &spec, NULL, &res, err);
}

/* The measured bound of a golden scenario that records its fp64 error:
 * the reference run `ref` against its fp64 shadow (fed the golden run
 * `gold`'s tokens), judged as the matrix judges it (KV_CMP_SHADOW), and *tol's
 * max_rel_err raised to KV_GOLDEN_BOUND_MULT x (reference's + golden's),
 * both recorded as tolerance rows. */
static KvStatus golden_bound(const KvModel *m, const KvGoldenScenario *s, const char *model_name,
                             const KvGateOptions *o, int64_t ref, int64_t gold, KvReport *rep,
                             KvTolerances *tol, KvError *err) {
    const KvRun *r = &rep->runs[ref];
    double fp64 = 0.0;
    KvStatus st = kv_shadow64_rel_error(m, r->batch, r->prompt_len, r->prompt, r->prompt_real,
                                        r->steps, rep->runs[gold].tokens, r->logits, NULL, &fp64,
                                        err);
    if (st != KV_OK) return st;
    KvComparison c;
    memset(&c, 0, sizeof c);
    c.kind = KV_CMP_SHADOW;
    c.run_a = c.run_b = ref;
    c.first_step = c.first_row = c.first_probe = -1;
    c.max_rel_err = fp64;
    c.verdict = fp64 <= KV_FP64_MAX_REL_ERR ? KV_VERDICT_PASS : KV_VERDICT_FAIL;
    snprintf(c.message, sizeof c.message, "the reference is %s its fp64 shadow: max rel err "
             "%.3g (bound %g)", c.verdict == KV_VERDICT_PASS ? "within" : "beyond", fp64,
             KV_FP64_MAX_REL_ERR);
    st = kv_gate_add_comparison(rep, &c, err);
    char name[KV_NAME_LEN], why[160];
    snprintf(name, sizeof name, "fp64_err@%.23s/%.27s", model_name, s->name);
    if (st == KV_OK) {
        st = kv_gate_add_tolerance(rep, name, fp64, "max rel logit err of the reference "
                                  "against its fp64 shadow (shadow64.h)", err);
    }
    snprintf(name, sizeof name, "golden_fp64_err@%.16s/%.27s", model_name, s->name);
    if (st == KV_OK) {
        st = kv_gate_add_tolerance(rep, name, s->fp64_rel_err, "max rel logit err of the "
                                  "golden against transformers in float64 (its fp64_rel_err)",
                                  err);
    }
    /* a reference beyond its shadow has no measured error to lend the
     * bound: that comparison fails, and this one keeps the floor */
    const double bound = c.verdict == KV_VERDICT_PASS
                             ? KV_GOLDEN_BOUND_MULT * (fp64 + s->fp64_rel_err) : 0.0;
    if (o->tol_max_rel_err_set) {
        snprintf(why, sizeof why, "set by --tol (the measured bound would be %.3g)", bound);
    } else {
        if (bound > tol->max_rel_err) tol->max_rel_err = bound;
        snprintf(why, sizeof why, "golden: max(%g, %g x (fp64_err + golden_fp64_err))%s",
                 KV_GOLDEN_MAX_REL_ERR, KV_GOLDEN_BOUND_MULT,
                 c.verdict == KV_VERDICT_PASS ? "" : "; fp64_err beyond its bound: the floor");
    }
    snprintf(name, sizeof name, "max_rel_err@%.23s/%.27s", model_name, s->name);
    return st == KV_OK ? kv_gate_add_tolerance(rep, name, tol->max_rel_err, why, err) : st;
}

KvStatus kv_gate_run_golden(const char *root, const char *family, const KvGateOptions *o,
                            KvReport *rep, int64_t *judged, KvError *err) {
    char dir[1024], path[1100], model_name[KV_NAME_LEN];
    snprintf(dir, sizeof dir, "%s/%s", root, family);
    snprintf(path, sizeof path, "%s/golden.h5", dir);
    snprintf(model_name, sizeof model_name, "hf/%.40s", family);
    const KvTolerances tol = {KV_GOLDEN_MAX_REL_ERR, KV_GOLDEN_TIE_MARGIN};
    return kv_gate_run_golden_at(dir, path, model_name, o, &tol, rep, judged, err);
}

KvStatus kv_gate_run_golden_at(const char *dir, const char *path, const char *model_name,
                               const KvGateOptions *o, const KvTolerances *tol, KvReport *rep,
                               int64_t *judged, KvError *err) {
    KvModel m;
    memset(&m, 0, sizeof m);
    KvGoldenFile g;
    KvStatus st = kv_golden_load(path, &g, err);
    if (st != KV_OK) return st;
    st = kv_model_load_dir(dir, &m, err);
    const int64_t first_run = rep->n_runs;
    for (int i = 0; i < g.n && st == KV_OK; i++) {
        KvGoldenScenario *s = &g.sc[i];
        if (s->vocab != m.config.vocab_size) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: /scenarios/%s/logits: vocabulary %lld, "
                              "the checkpoint's is %lld", path, s->name, (long long)s->vocab,
                              (long long)m.config.vocab_size);
            break;
        }
        for (int64_t k = 0; k < s->steps * s->batch && st == KV_OK; k++) {
            if (s->tokens[k] < 0 || s->tokens[k] >= s->vocab) {
                st = kv_error_set(err, KV_ERR_INPUT, "%s: /scenarios/%s/tokens: id %d outside "
                                  "the vocabulary", path, s->name, s->tokens[k]);
            }
        }
        if (st != KV_OK) break;
        /* the reference fed transformers' tokens: one flip at a near-tie
         * does not derail the rest of the comparison */
        const int32_t *forced = s->tokens;
        KvScenario sc = {.batch = s->batch, .prompt_len = s->prompt_len, .prompt = s->input_ids,
                         .real = s->mask, .new_tokens = s->steps};
        snprintf(sc.name, sizeof sc.name, "%s", s->name);
        int64_t ref = -1, gold = -1;
        st = kv_gate_run_forced_reference(&m, model_name, &sc, o, forced, rep, &ref, err);
        if (st == KV_OK) st = golden_run(s, &m.config, model_name, path, rep, &gold, err);
        KvTolerances use = *tol;
        if (st == KV_OK && s->fp64_rel_err >= 0.0) {
            st = golden_bound(&m, s, model_name, o, ref, gold, rep, &use, err);
        }
        if (st != KV_OK) break;
        KvComparison c;
        kv_compare_outputs_forced(&rep->runs[gold], &rep->runs[ref], &use, KV_CMP_GOLDEN, gold,
                                  ref, &c);
        st = kv_gate_add_comparison(rep, &c, err);
        ++*judged;
        if (st != KV_OK || rep->runs[ref].batch < 2) continue;
        /* the logits must be full: this runs before any top-k trimming; the
         * batch was fed transformers' tokens, and so is each row alone */
        st = kv_gate_rows_alone(&m, &rep->runs[ref], rep->runs[gold].tokens, NULL, &c, err);
        c.run_a = gold;
        c.run_b = ref;
        if (st == KV_OK) st = kv_gate_add_comparison(rep, &c, err);
        ++*judged;
    }
    /* every comparison above saw the full rows; a large vocabulary keeps
     * top-k in the report, as the matrix's runs do */
    for (int64_t r = first_run; r < rep->n_runs && st == KV_OK; r++) {
        if (rep->runs[r].logits != NULL && rep->runs[r].vocab > o->full_logits_max_vocab) {
            st = kv_gate_keep_topk(&rep->runs[r], err);
        }
    }
    kv_golden_file_free(&g);
    kv_model_free(&m);
    return st;
}
