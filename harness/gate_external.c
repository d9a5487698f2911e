/* gate_external.c: the gate for runs another engine recorded in the report
 * schema (gate_external.h). Everything that can be refused is refused before
 * the first reference decode: the files are read whole, each run is checked
 * against the model (vocabulary, prompt ids, left padding, kept top-k ids),
 * run labels must be unique, and the prompt batches are grouped. Then the
 * CPU reference decodes each group's batch once, and the external runs are
 * judged by their outputs against it and against each other; the report,
 * table, JUnit and exit code are the matrix gate's (gate_output.h). */
#include "gate_external.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "decode.h"
#include "ensemble.h"
#include "gate_output.h"
#include "gate_verdict.h"
#include "matrix.h"
#include "model.h"
#include "report.h"
#include "report_h5.h"
#include "scenario.h"

/* The external runs of every file, moved out of their reports in file
 * order, with where each came from (for messages). */
typedef struct {
    KvRun *runs;        /* (n) */
    const char **path;  /* (n) the file of run k */
    int64_t *index;     /* (n) its index in that file */
    int64_t n;
} ExtRuns;

/* One CPU reference decode: the (scenario, steps, prompt, prompt_real) of
 * the external run `leader`, its first member. */
typedef struct {
    int64_t leader;  /* index into ExtRuns */
    int64_t ref;     /* its reference run's index in the report */
    char skip[256];  /* "" or why its reference comparisons are skipped */
    KvTolerances tol; /* its tolerances: calibrated on its reference decode, or o->tol */
    /* The bf16 yardstick (ext_bf16_yardstick): whether its bf16 runs have
     * one, and the tolerances they are judged by then. */
    bool bf16_judged;
    KvTolerances tol_bf16;
} ExtGroup;

static void ext_runs_free(ExtRuns *e) {
    for (int64_t k = 0; k < e->n; k++) kv_run_free(&e->runs[k]);
    free(e->runs);
    free(e->path);
    free(e->index);
    memset(e, 0, sizeof *e);
}

/* "MODEL/SCENARIO/VARIANT[+FAULT]/BACKEND/MODE/rN": the label show, diff and
 * bisect select a run by. */
static void ext_label(const KvRun *r, char *out, size_t n) {
    char rl[192];
    kv_run_label(r, rl, sizeof rl);
    snprintf(out, n, "%.64s/%.64s/%s", r->model, r->scenario, rl);
}

/* "A.h5: runs/0003 (LABEL)": where external run k is, for messages. */
static void ext_where(const ExtRuns *e, int64_t k, char *out, size_t n) {
    char label[400];
    ext_label(&e->runs[k], label, sizeof label);
    snprintf(out, n, "%s: runs/%04" PRId64 " (%s)", e->path[k], e->index[k], label);
}

/* Appends the runs of one report (moved: rep keeps no run) to e. */
static KvStatus ext_take_runs(ExtRuns *e, KvReport *rep, const char *path, KvError *err) {
    const size_t n = (size_t)(e->n + rep->n_runs);
    KvRun *runs = realloc(e->runs, (n > 0 ? n : 1) * sizeof *runs);
    if (runs != NULL) e->runs = runs;
    const char **paths = realloc(e->path, (n > 0 ? n : 1) * sizeof *paths);
    if (paths != NULL) e->path = paths;
    int64_t *index = realloc(e->index, (n > 0 ? n : 1) * sizeof *index);
    if (index != NULL) e->index = index;
    if (runs == NULL || paths == NULL || index == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        e->runs[e->n] = rep->runs[i];
        e->path[e->n] = path;
        e->index[e->n] = i;
        e->n++;
    }
    /* the runs' arrays now belong to e */
    free(rep->runs);
    rep->runs = NULL;
    rep->n_runs = 0;
    return KV_OK;
}

/* Run k's label, for sorting. */
typedef struct {
    char label[400];
    int64_t k;
} ExtLabel;

static int ext_label_cmp(const void *x, const void *y) {
    const ExtLabel *a = x, *b = y;
    const int c = strcmp(a->label, b->label);
    return c != 0 ? c : (a->k > b->k) - (a->k < b->k);
}

/* Each run label at most once over all files: two recordings of one run
 * would be judged twice and selected by label as one. */
static KvStatus ext_check_labels(const ExtRuns *e, KvError *err) {
    if (e->n < 2) return KV_OK;
    ExtLabel *l = malloc((size_t)e->n * sizeof *l);
    if (l == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    for (int64_t k = 0; k < e->n; k++) {
        ext_label(&e->runs[k], l[k].label, sizeof l[k].label);
        l[k].k = k;
    }
    qsort(l, (size_t)e->n, sizeof *l, ext_label_cmp);
    KvStatus st = KV_OK;
    for (int64_t i = 1; i < e->n && st == KV_OK; i++) {
        if (strcmp(l[i - 1].label, l[i].label) != 0) continue;
        const int64_t a = l[i - 1].k, b = l[i].k;
        st = kv_error_set(err, KV_ERR_INPUT, "%s: runs/%04" PRId64 ": run label %s is given "
                          "again, by %s: runs/%04" PRId64 " (each run may be recorded once over "
                          "all --external files)", e->path[b], e->index[b], l[i].label,
                          e->path[a], e->index[a]);
    }
    free(l);
    return st;
}

/* Reads every --external file whole (KV_ERR_INPUT naming the file and the
 * object on any problem) and checks the labels. */
static KvStatus ext_read(const KvExternalOptions *o, ExtRuns *e, KvError *err) {
    for (int f = 0; f < o->n_paths; f++) {
        KvReport rep;
        KvStatus st = kv_report_read_h5(o->paths[f], &rep, err);
        if (st != KV_OK) return st;
        if (rep.n_runs == 0) {
            kv_report_free(&rep);
            return kv_error_set(err, KV_ERR_INPUT, "%s: /runs: expected at least one run, found "
                                "none", o->paths[f]);
        }
        st = ext_take_runs(e, &rep, o->paths[f], err);
        kv_report_free(&rep);
        if (st != KV_OK) return st;
    }
    return ext_check_labels(e, err);
}

/* Everything the reference decode and the comparisons will index, checked
 * against the model: vocab (a skipped run that never ran may leave it 0),
 * and for a run that ran its prompt batch (ids, left padding, sizes: what
 * the decode itself checks) and its kept top-k ids. */
static KvStatus ext_check_run(const ExtRuns *e, int64_t k, const KvModel *m,
                              const char *model_dir, KvError *err) {
    const KvRun *r = &e->runs[k];
    const int64_t V = m->config.vocab_size;
    char where[700];
    ext_where(e, k, where, sizeof where);
    if (r->vocab != V && !(r->skipped && r->vocab == 0)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: vocab: expected %lld, the vocabulary of %s, "
                            "found %lld", where, (long long)V, model_dir, (long long)r->vocab);
    }
    if (r->skipped) return KV_OK;
    const KvDecodeSpec spec = {
        .batch = r->batch,
        .prompt_len = r->prompt_len,
        .prompt = r->prompt,
        .prompt_real = r->prompt_real,
        .new_tokens = r->steps,
    };
    KvStatus st = kv_decode_check_spec(m, &spec, err);
    if (st != KV_OK) {
        kv_error_prefix(err, where);
        return st;
    }
    for (int64_t i = 0; i < r->steps * r->batch; i++) {
        if (r->tokens[i] >= 0 && r->tokens[i] < V) continue;
        /* a token the reference could not be fed (teacher forcing) */
        return kv_error_set(err, KV_ERR_INPUT, "%s: tokens[step %lld, row %lld]: expected a "
                            "token id in [0, %lld), found %d", where,
                            (long long)(i / r->batch), (long long)(i % r->batch), (long long)V,
                            r->tokens[i]);
    }
    for (int64_t i = 0; i < r->steps * r->batch * r->topk; i++) {
        if (r->topk_ids[i] >= 0 && r->topk_ids[i] < V) continue;
        const int64_t K = r->topk;
        return kv_error_set(err, KV_ERR_INPUT, "%s: topk_ids[step %lld, row %lld, %lld]: "
                            "expected a token id in [0, %lld), found %d", where,
                            (long long)(i / (r->batch * K)), (long long)(i / K % r->batch),
                            (long long)(i % K), (long long)V, r->topk_ids[i]);
    }
    return KV_OK;
}

static bool ext_same_prompt(const KvRun *a, const KvRun *b) {
    const size_t n = (size_t)(a->batch * a->prompt_len);
    return a->batch == b->batch && a->prompt_len == b->prompt_len &&
           memcmp(a->prompt, b->prompt, n * sizeof *a->prompt) == 0 &&
           memcmp(a->prompt_real, b->prompt_real, n) == 0;
}

/* Groups the runs that ran by (scenario, steps, prompt, prompt_real):
 * group_of[k] is run k's group (-1 when skipped), *groups the groups in
 * order of their first member. One scenario name with two prompt batches
 * is bad input: the reference runs are named by their scenario. */
static KvStatus ext_group(const ExtRuns *e, ExtGroup **groups, int64_t *n_groups,
                          int64_t *group_of, KvError *err) {
    *groups = NULL;
    *n_groups = 0;
    for (int64_t k = 0; k < e->n; k++) {
        const KvRun *r = &e->runs[k];
        group_of[k] = -1;
        if (r->skipped) continue;
        for (int64_t g = 0; g < *n_groups && group_of[k] < 0; g++) {
            const int64_t j = (*groups)[g].leader;
            const KvRun *l = &e->runs[j];
            if (strncmp(l->scenario, r->scenario, KV_NAME_LEN) != 0) continue;
            if (!ext_same_prompt(l, r)) {
                char wk[700], wj[700];
                ext_where(e, k, wk, sizeof wk);
                ext_where(e, j, wj, sizeof wj);
                return kv_error_set(err, KV_ERR_INPUT, "%s: prompt: scenario '%.64s' has another "
                                    "prompt batch in %s (%lld x %lld vs %lld x %lld, or other "
                                    "tokens or padding); one scenario name, one prompt batch",
                                    wk, r->scenario, wj, (long long)r->batch,
                                    (long long)r->prompt_len, (long long)l->batch,
                                    (long long)l->prompt_len);
            }
            if (l->steps == r->steps) group_of[k] = g;
        }
        if (group_of[k] >= 0) continue;
        ExtGroup *grown = realloc(*groups, (size_t)(*n_groups + 1) * sizeof *grown);
        if (grown == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        *groups = grown;
        grown[*n_groups] = (ExtGroup){.leader = k, .ref = -1, .skip = ""};
        group_of[k] = (*n_groups)++;
    }
    return KV_OK;
}

/* The CPU reference decode of each group's prompt batch, appended to rep
 * (with its finite check). A reference that is not finite fails by its own
 * check; its group's reference comparisons are then skipped with the
 * reason instead of failing on the same NaN. */
/* The scenario a run decoded: its prompt batch (borrowed: a decode copies
 * what it records), its step count and its name, prefilled whole (the
 * reference is bitwise the same for any chunking). */
static KvScenario ext_scenario(const KvRun *r) {
    KvScenario sc = {
        .batch = r->batch,
        .prompt_len = r->prompt_len,
        .prompt = r->prompt,
        .real = r->prompt_real,
        .new_tokens = r->steps,
        .prefill_chunk = 0,
        .texts = r->prompt_text, /* the recording's row texts go to its reference */
    };
    snprintf(sc.name, sizeof sc.name, "%.63s", r->scenario);
    snprintf(sc.tokenizer, sizeof sc.tokenizer, "%s", r->tokenizer);
    return sc;
}

/* The matrix options the reference decodes and the calibration run with:
 * no progress, one shard, the external gate's tolerances and settings. */
static KvGateOptions ext_gate_options(const KvExternalOptions *o) {
    const KvGateOptions go = {
        .tol = o->tol,
        .tol_max_rel_err_set = o->tol_max_rel_err_set,
        .calibrate = o->calibrate,
        .timings = o->timings,
        .progress = KV_PROGRESS_OFF,
        .shard_i = 1,
        .shard_n = 1,
        .full_logits_max_vocab = o->full_logits_max_vocab,
    };
    return go;
}

static KvStatus ext_run_references(const ExtRuns *e, ExtGroup *groups, int64_t n_groups,
                                   const KvModel *m, const char *model_name,
                                   const KvExternalOptions *o, KvReport *rep, KvError *err) {
    const KvGateOptions go = ext_gate_options(o);
    for (int64_t g = 0; g < n_groups; g++) {
        const KvScenario sc = ext_scenario(&e->runs[groups[g].leader]);
        KvComparison fin;
        KvStatus st = kv_gate_run_reference(m, model_name, &sc, &go, NULL, rep, &groups[g].ref,
                                            &fin, err);
        groups[g].tol = o->tol;
        if (st != KV_OK) {
            char where[700];
            ext_where(e, groups[g].leader, where, sizeof where);
            char prefix[800];
            snprintf(prefix, sizeof prefix, "the reference decode of the prompt batch of %s",
                     where);
            kv_error_prefix(err, prefix);
            return st;
        }
        if (fin.verdict == KV_VERDICT_FAIL) {
            const KvRun *ref = &rep->runs[groups[g].ref];
            snprintf(groups[g].skip, sizeof groups[g].skip, "not compared: the reference is not "
                     "finite (step %lld, probe %.64s)", (long long)fin.first_step,
                     fin.first_probe >= 0 ? ref->probe_names[fin.first_probe] : "logits");
        }
    }
    return KV_OK;
}

/* The calibration of each group (o->calibrate; kv_gate_calibrate): its
 * ensemble members go to the end of rep, after the external runs, so the
 * reference runs keep indices [0, n_groups) and the external runs follow
 * them in file order; groups[g].tol becomes the group's tolerances. */
static KvStatus ext_calibrate(ExtGroup *groups, int64_t n_groups, const KvModel *m,
                              const char *model_name, const KvExternalOptions *o, KvReport *rep,
                              KvError *err) {
    const KvGateOptions go = ext_gate_options(o);
    for (int64_t g = 0; g < n_groups && o->calibrate; g++) {
        const KvScenario sc = ext_scenario(&rep->runs[groups[g].ref]);
        KvStatus st = kv_gate_calibrate(m, model_name, &sc, &go, groups[g].ref,
                                        groups[g].skip[0] == '\0', rep, &groups[g].tol, err);
        if (st != KV_OK) return st;
        if (!o->quiet && groups[g].skip[0] == '\0') {
            printf("calibrated %s: max_rel_err %g\n", sc.name, groups[g].tol.max_rel_err);
            fflush(stdout);
        }
    }
    return KV_OK;
}

/* An external run of rep (indices [lo, hi)) with x's model, scenario,
 * variant and fault, backend, the given mode and repeat 0, that ran; -1
 * when there is none. */
static int64_t ext_find_twin(const KvReport *rep, int64_t lo, int64_t hi, const KvRun *x,
                             const char *mode) {
    for (int64_t i = lo; i < hi; i++) {
        const KvRun *r = &rep->runs[i];
        if (r->repeat == 0 && !r->skipped && strncmp(r->model, x->model, KV_NAME_LEN) == 0 &&
            strncmp(r->scenario, x->scenario, KV_NAME_LEN) == 0 &&
            strncmp(r->variant, x->variant, KV_NAME_LEN) == 0 &&
            strncmp(r->fault, x->fault, KV_NAME_LEN) == 0 &&
            strncmp(r->backend, x->backend, sizeof r->backend) == 0 &&
            strncmp(r->mode, mode, sizeof r->mode) == 0) {
            return i;
        }
    }
    return -1;
}

/* A run of another engine computed in bfloat16 (its recorded dtype). */
static bool ext_is_bf16(const KvRun *r) {
    return strncmp(r->dtype, "bf16", sizeof r->dtype) == 0;
}

/* max over steps and rows of kv_compare_row_rel_err, each row up to the
 * first step whose tokens differ (after a flip the rows are fed different
 * tokens); -1 when the runs' shapes differ. A non-finite logit counts in
 * neither max: that run's own finite check fails the gate. */
static double ext_rel_until_flip(const KvRun *a, const KvRun *b) {
    if (a->steps != b->steps || a->batch != b->batch || a->vocab != b->vocab ||
        a->logits == NULL || b->logits == NULL) {
        return -1.0;
    }
    const int64_t B = a->batch, V = a->vocab;
    double worst = 0.0;
    for (int64_t r = 0; r < B; r++) {
        for (int64_t s = 0; s < a->steps; s++) {
            const float *x = a->logits + (s * B + r) * V, *y = b->logits + (s * B + r) * V;
            const double rel = kv_compare_row_rel_err(x, y, V);
            worst = rel > worst ? rel : worst;
            if (a->tokens[s * B + r] != b->tokens[s * B + r]) break;
        }
    }
    return worst;
}

/* Whether r can stand for the engine in the bf16 yardstick: an eager bf16
 * run of transformers' own cache classes (never a cache layer under test,
 * which would otherwise set its own tolerance), its attention kernel named. */
static bool ext_bf16_member(const KvRun *r) {
    return !r->skipped && ext_is_bf16(r) && r->repeat == 0 && r->logits != NULL &&
           strncmp(r->mode, "eager", sizeof r->mode) == 0 && r->attn_impl[0] != '\0' &&
           (strncmp(r->cache_layer, "static_sliding", KV_NAME_LEN) == 0 ||
            strncmp(r->cache_layer, "dynamic_sliding", KV_NAME_LEN) == 0);
}

/* The bf16 yardstick of each group (DESIGN §6): fp32's calibration bounds
 * fp32 rounding, which bfloat16 exceeds a thousandfold, so a bf16 run is
 * judged against the spread of the engine's own bf16 eager runs of the same
 * batch under another attention kernel (transformers' own cache class, the
 * same in both: ext_bf16_member): the largest relative logit error between
 * two of them, each row up to its first flip. Its runs are then held to
 * KV_BF16_SPREAD_MULT x that spread,
 * and a margin of KV_BF16_TIE_ULPS bf16 ulps of the largest logit is a
 * near-tie. Recorded as bf16_spread@, bf16_max_rel_err@ and
 * bf16_tie_margin@ rows; a group with fewer than two such runs has none,
 * and its bf16 runs stay judged (and failed) by fp32's yardstick, the
 * message saying what to capture. */
static KvStatus ext_bf16_yardstick(ExtGroup *groups, int64_t n_groups, const int64_t *group_of,
                                   int64_t first_ext, int64_t end_ext, const char *model_name,
                                   KvReport *rep, KvError *err) {
    for (int64_t g = 0; g < n_groups; g++) {
        double spread = -1.0, top = 0.0;
        char pair[200] = "";
        for (int64_t a = first_ext; a < end_ext; a++) {
            const KvRun *ra = &rep->runs[a];
            if (group_of[a - first_ext] != g || !ext_bf16_member(ra)) continue;
            for (int64_t i = 0; i < ra->steps * ra->batch * ra->vocab; i++) {
                const double v = fabs((double)ra->logits[i]);
                top = isfinite(v) && v > top ? v : top;
            }
            for (int64_t b = a + 1; b < end_ext; b++) {
                const KvRun *rb = &rep->runs[b];
                if (group_of[b - first_ext] != g || !ext_bf16_member(rb) ||
                    strncmp(ra->cache_layer, rb->cache_layer, KV_NAME_LEN) != 0 ||
                    strncmp(ra->attn_impl, rb->attn_impl, sizeof ra->attn_impl) == 0) {
                    continue;
                }
                const double e = ext_rel_until_flip(ra, rb);
                if (e > spread) {
                    spread = e;
                    snprintf(pair, sizeof pair, "%.60s vs %.60s", ra->variant, rb->variant);
                }
            }
        }
        if (spread < 0.0) continue;
        ExtGroup *gr = &groups[g];
        gr->bf16_judged = true;
        gr->tol_bf16 = gr->tol;
        gr->tol_bf16.max_rel_err = KV_BF16_SPREAD_MULT * spread;
        gr->tol_bf16.tie_margin = KV_BF16_TIE_ULPS * ldexp(top, -7);
        const char *scen = rep->runs[gr->ref].scenario;
        char name[KV_NAME_LEN], reason[160];
        snprintf(name, sizeof name, "bf16_spread@%.22s/%.27s", model_name, scen);
        snprintf(reason, sizeof reason, "max rel logit err between the engine's bf16 eager runs "
                 "under two attention kernels: %.70s", pair);
        KvStatus st = kv_gate_add_tolerance(rep, name, spread, reason, err);
        snprintf(name, sizeof name, "bf16_max_rel_err@%.22s/%.22s", model_name, scen);
        snprintf(reason, sizeof reason, "the bf16 runs' max_rel_err: %d x bf16_spread",
                 KV_BF16_SPREAD_MULT);
        if (st == KV_OK) st = kv_gate_add_tolerance(rep, name, gr->tol_bf16.max_rel_err, reason,
                                                    err);
        snprintf(name, sizeof name, "bf16_tie_margin@%.22s/%.22s", model_name, scen);
        snprintf(reason, sizeof reason, "the bf16 runs' tie_margin: %d bf16 ulps (2^-7 relative) "
                 "of the largest logit, %.4g", KV_BF16_TIE_ULPS, top);
        if (st == KV_OK) st = kv_gate_add_tolerance(rep, name, gr->tol_bf16.tie_margin, reason,
                                                    err);
        if (st != KV_OK) return st;
    }
    return KV_OK;
}

/* What judging needs besides the report: the model and its name, the
 * options, and how many forced reference runs were added so far (their
 * repeat numbers, which keep their labels apart). */
typedef struct {
    const KvModel *m;
    const char *model_name;
    const KvExternalOptions *o;
    int64_t n_forced;
} ExtJudge;

/* After a flip at a near-tie the two runs are fed different tokens, so
 * the rest of that row says nothing about x. The reference is decoded again
 * teacher-forced with x's tokens (appended to rep as
 * "reference~forced/cpu/eager/rN"), and x is judged against it at every
 * step of every row; *c becomes that comparison, its message saying from
 * which step of which row the inputs were forced. */
static KvStatus ext_compare_forced(KvReport *rep, int64_t x, const ExtGroup *g,
                                   const KvTolerances *tol, ExtJudge *j, KvComparison *c,
                                   KvError *err) {
    int64_t first_s = -1, first_b = -1;
    {
        const KvRun *ref = &rep->runs[g->ref], *run = &rep->runs[x];
        for (int64_t i = 0; i < run->steps * run->batch && first_s < 0; i++) {
            if (ref->tokens[i] != run->tokens[i]) {
                first_s = i / run->batch;
                first_b = i % run->batch;
            }
        }
    }
    const KvScenario sc = ext_scenario(&rep->runs[g->ref]);
    const KvGateOptions go = ext_gate_options(j->o);
    /* x's tokens: copied, the report's runs array may move as runs are added */
    const size_t n = (size_t)(rep->runs[x].steps * rep->runs[x].batch);
    int32_t *forced = malloc((n > 0 ? n : 1) * sizeof *forced);
    if (forced == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    memcpy(forced, rep->runs[x].tokens, n * sizeof *forced);
    int64_t idx = -1;
    KvStatus st = kv_gate_run_forced_reference(j->m, j->model_name, &sc, &go, forced, rep, &idx,
                                               err);
    free(forced);
    if (st != KV_OK) return st;
    KvRun *fr = &rep->runs[idx];
    snprintf(fr->variant, sizeof fr->variant, "reference~forced");
    fr->repeat = j->n_forced++;
    kv_compare_outputs_forced(fr, &rep->runs[x], tol, KV_CMP_REFERENCE, idx, x, c);
    char note[200];
    snprintf(note, sizeof note, "; the reference teacher-forced with this run's tokens (row "
             "%lld flipped at a near-tie at step %lld: forced from step %lld on)",
             (long long)first_b, (long long)first_s, (long long)first_s + 1);
    const size_t used = strlen(c->message);
    snprintf(c->message + used, sizeof c->message - used, "%s", note);
    return KV_OK;
}

/* The comparisons of external run x (gate_external.h gives the list). */
static KvStatus ext_compare_run(KvReport *rep, int64_t x, int64_t lo, int64_t hi,
                                const ExtGroup *g, ExtJudge *j, KvError *err) {
    const bool bf16 = ext_is_bf16(&rep->runs[x]);
    const KvTolerances *tol = bf16 && g->bf16_judged ? &g->tol_bf16 : &g->tol;
    KvComparison c;
    kv_compare_outputs(&rep->runs[g->ref], &rep->runs[x], tol, KV_CMP_REFERENCE, g->ref, x, &c);
    if (g->skip[0] == '\0' && c.verdict == KV_VERDICT_PASS && c.near_ties > 0) {
        const KvStatus fst = ext_compare_forced(rep, x, g, tol, j, &c, err);
        if (fst != KV_OK) return fst;
    }
    if (bf16 && !g->bf16_judged && c.verdict == KV_VERDICT_FAIL) {
        /* judged by fp32's yardstick, which no bf16 engine meets */
        const size_t used = strlen(c.message);
        snprintf(c.message + used, sizeof c.message - used, "; a bf16 run is judged by a bf16 "
                 "yardstick: capture this batch in bf16 eager with two attention kernels "
                 "(--cache static_sliding --attn eager,sdpa)");
    }
    const KvRun *run = &rep->runs[x];
    if (g->skip[0] != '\0') {
        c.verdict = KV_VERDICT_SKIP;
        c.first_step = c.first_row = c.first_probe = -1;
        snprintf(c.message, sizeof c.message, "%s", g->skip);
    }
    KvStatus st = kv_gate_add_comparison(rep, &c, err);
    if (st != KV_OK) return st;
    kv_compare_finite(run, x, &c);
    st = kv_gate_add_comparison(rep, &c, err);
    if (st != KV_OK) return st;
    if (run->repeat > 0) {
        const int64_t first = ext_find_twin(rep, lo, hi, run, run->mode);
        if (first >= 0) {
            kv_compare_repeat(&rep->runs[first], run, first, x, &c);
            st = kv_gate_add_comparison(rep, &c, err);
            if (st != KV_OK) return st;
        }
    }
    if (run->repeat == 0 && strncmp(run->mode, "eager", sizeof run->mode) != 0) {
        const int64_t eager = ext_find_twin(rep, lo, hi, run, "eager");
        if (eager >= 0) {
            kv_compare_outputs(&rep->runs[eager], run, tol, KV_CMP_COMPILED, eager, x, &c);
            st = kv_gate_add_comparison(rep, &c, err);
            if (st != KV_OK) return st;
        }
    }
    if (run->graph_budget >= 0) {
        kv_compare_graph_budget(run, x, &c);
        st = kv_gate_add_comparison(rep, &c, err);
    }
    return st;
}

/* The CPU work of the reference decodes and, calibrating, each group's
 * reduction-order members and fp64 shadow (kv_gate_work_add counts them,
 * once), refused above KV_GATE_MAX_WORK_FLOP without --allow-large-work as
 * the matrix gate refuses it: a small file can hold a prompt that runs for
 * hours. */
static KvStatus ext_check_work(const ExtRuns *e, const ExtGroup *groups, int64_t n_groups,
                               const KvModel *m, const KvExternalOptions *o, KvError *err) {
    KvGateWork w, refs; /* everything, and the reference decodes alone */
    memset(&w, 0, sizeof w);
    memset(&refs, 0, sizeof refs);
    for (int64_t g = 0; g < n_groups; g++) {
        const KvScenario sc = ext_scenario(&e->runs[groups[g].leader]);
        KvGateOptions go = ext_gate_options(o);
        go.custom = &sc;
        int unit = 0;
        KvStatus st = kv_gate_work_add(&m->config, &go, NULL, &unit, &w, err);
        if (st != KV_OK) return st;
        go.calibrate = false;
        unit = 0;
        st = kv_gate_work_add(&m->config, &go, NULL, &unit, &refs, err);
        if (st != KV_OK) return st;
    }
    const double flop = w.flop;
    if (!o->quiet) {
        printf("work: %lld reference decodes%s, %lld token positions, ~%.3g GFLOP\n",
               (long long)refs.decodes, o->calibrate ? " and their calibration" : "",
               (long long)w.tokens, flop / 1e9);
    }
    if (flop > KV_GATE_MAX_WORK_FLOP && !o->allow_large) {
        return kv_error_set(err, KV_ERR_INPUT, "the external runs' prompt batches are ~%.3g "
                            "TFLOP of CPU reference work (%lld decodes, %lld token positions), "
                            "above the %.3g TFLOP that runs without asking; pass "
                            "--allow-large-work (or --no-calibrate: the calibration is %.0f%% "
                            "of it)", flop / 1e12, (long long)w.decodes, (long long)w.tokens,
                            KV_GATE_MAX_WORK_FLOP / 1e12,
                            flop > 0.0 ? 100.0 * (flop - refs.flop) / flop : 0.0);
    }
    return KV_OK;
}

/* The lines the log opens with: the model, each file, the reference
 * decodes and the tolerances. */
static void ext_print_header(const KvExternalOptions *o, const ExtRuns *e, const KvModel *m,
                             const char *model_name, uint64_t model_hash, int64_t n_groups) {
    printf("%s gate --external\n", kv_cli_version());
    printf("model %s: %s, %lld layers, window %lld, weights fnv1a64 0x%016" PRIx64 "\n",
           model_name, m->config.model_type, (long long)m->config.num_layers,
           (long long)m->config.sliding_window, model_hash);
    for (int f = 0; f < o->n_paths; f++) {
        int64_t runs = 0, skipped = 0;
        const char *engine = NULL;
        for (int64_t k = 0; k < e->n; k++) {
            if (e->path[k] != o->paths[f]) continue;
            runs++;
            skipped += e->runs[k].skipped;
            if (engine == NULL && e->runs[k].engine[0] != '\0') engine = e->runs[k].engine;
        }
        printf("external %s: %lld run%s, %lld skipped%s%.256s%s\n", o->paths[f],
               (long long)runs, runs == 1 ? "" : "s", (long long)skipped,
               engine != NULL ? " (" : "", engine != NULL ? engine : "",
               engine != NULL ? ")" : "");
    }
    char mre[64];
    if (o->calibrate && !o->tol_max_rel_err_set) {
        snprintf(mre, sizeof mre, "calibrated per prompt batch");
    } else {
        snprintf(mre, sizeof mre, "%g", o->tol.max_rel_err);
    }
    printf("reference: %lld CPU decode%s (one per prompt batch); tolerances: max_rel_err %s, "
           "tie_margin %g\n", (long long)n_groups, n_groups == 1 ? "" : "s", mre,
           o->tol.tie_margin);
    fflush(stdout);
}

/* The model directory's basename (a trailing '/' ignored) into name: what
 * the Python side names its runs by. */
static void ext_model_name(const char *dir, char name[KV_NAME_LEN]) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(name, KV_NAME_LEN, "%.*s", (int)(n - start), dir + start);
}

/* A reference run and an external run may not share a label (an external
 * file holding kvrepro's own reference run): show, diff and bisect select
 * runs by label. */
static KvStatus ext_check_reference_labels(const KvReport *rep, int64_t n_refs, const ExtRuns *e,
                                           KvError *err) {
    for (int64_t i = 0; i < n_refs; i++) {
        char ref[400];
        ext_label(&rep->runs[i], ref, sizeof ref);
        for (int64_t k = 0; k < e->n; k++) {
            char label[400];
            ext_label(&e->runs[k], label, sizeof label);
            if (strcmp(ref, label) != 0) continue;
            char where[700];
            ext_where(e, k, where, sizeof where);
            return kv_error_set(err, KV_ERR_INPUT, "%s: the run has the label of the CPU "
                                "reference run the gate adds for its prompt batch; an external "
                                "run names its own variant and backend", where);
        }
    }
    return KV_OK;
}

/* Moves the external runs to the end of rep, in file order. */
static KvStatus ext_append_runs(KvReport *rep, ExtRuns *e, KvError *err) {
    KvRun *runs = realloc(rep->runs, (size_t)(rep->n_runs + e->n) * sizeof *runs);
    if (runs == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    rep->runs = runs;
    memcpy(rep->runs + rep->n_runs, e->runs, (size_t)e->n * sizeof *runs);
    rep->n_runs += e->n;
    /* the arrays now belong to rep; e keeps its paths for messages */
    for (int64_t k = 0; k < e->n; k++) kv_run_init(&e->runs[k]);
    return KV_OK;
}

/* Judges every external run and prints the failures and (unless quiet)
 * the summary table; the count line comes once the output files are
 * written (kv_gate_external). *failed says whether a comparison failed. */
static KvStatus ext_judge(const KvExternalOptions *o, const ExtGroup *groups,
                          const int64_t *group_of, int64_t first_ext, int64_t end_ext,
                          ExtJudge *j, KvReport *rep, bool *failed, KvError *err) {
    const int64_t hi = end_ext;
    for (int64_t x = first_ext; x < hi; x++) {
        if (rep->runs[x].skipped) {
            /* its SKIP row says why; a run the engine could not complete
             * ("failed: ...") gets its failing finite check */
            KvComparison c;
            kv_compare_finite(&rep->runs[x], x, &c);
            if (c.verdict != KV_VERDICT_FAIL) continue;
            const KvStatus st = kv_gate_add_comparison(rep, &c, err);
            if (st != KV_OK) return st;
            continue;
        }
        const KvStatus st = ext_compare_run(rep, x, first_ext, hi,
                                            &groups[group_of[x - first_ext]], j, err);
        if (st != KV_OK) return st;
    }
    /* Every comparison is made on the full rows the gate decoded: large
     * vocabularies now keep only the top-k logits of the calibration members
     * and forced references that passed, as in the matrix gate; the
     * references [0, first_ext) keep their full rows, and so does every run
     * of a failed tolerance comparison (the external runs keep what their
     * engine stored). */
    if (rep->n_runs > end_ext && rep->runs[end_ext].vocab > o->full_logits_max_vocab) {
        /* the calibration members and forced references follow the external runs */
        const KvStatus st =
            kv_gate_trim_logits(rep, end_ext, rep->n_runs, NULL, 0, KV_FAILING_FULL_MAX, 0, err);
        if (st != KV_OK) return st;
    }
    *failed = kv_gate_print_failures(rep, false, o->verbose, false, NULL, stdout);
    const KvStatus st = o->quiet ? KV_OK : kv_report_print_table_folded(rep, NULL, 0, stdout);
    if (st != KV_OK) return kv_error_set(err, st, "cannot print the summary table");
    return KV_OK;
}

int kv_gate_external(const KvExternalOptions *o) {
    KvError err = {{0}};
    ExtRuns e = {NULL, NULL, NULL, 0};
    KvModel m;
    memset(&m, 0, sizeof m);
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    ExtGroup *groups = NULL;
    int64_t n_groups = 0, *group_of = NULL;
    bool failed = false;
    int rc = KV_EXIT_PASS;
    /* Everything that can be refused is refused before the first decode. */
    KvStatus st = kv_gate_check_outputs(o->report_path, o->junit_path, &err);
    if (st == KV_OK) {
        st = kv_gate_check_outputs_apart(o->report_path, o->junit_path, o->paths, o->n_paths,
                                         &o->model_dir, 1, &err);
    }
    if (st == KV_OK) st = ext_read(o, &e, &err);
    if (st == KV_OK) st = kv_model_load_dir(o->model_dir, &m, &err);
    if (st != KV_OK) goto cleanup;
    char model_name[KV_NAME_LEN];
    ext_model_name(o->model_dir, model_name);
    for (int64_t k = 0; k < e.n && st == KV_OK; k++) st = ext_check_run(&e, k, &m, o->model_dir, &err);
    group_of = malloc((size_t)(e.n > 0 ? e.n : 1) * sizeof *group_of);
    if (st == KV_OK && group_of == NULL) st = kv_error_set(&err, KV_ERR_INTERNAL, "out of memory");
    if (st == KV_OK) st = ext_group(&e, &groups, &n_groups, group_of, &err);
    if (st != KV_OK) goto cleanup;
    for (int64_t k = 0; k < e.n; k++) {
        if (strncmp(e.runs[k].model, model_name, KV_NAME_LEN) == 0) continue;
        char where[700];
        ext_where(&e, k, where, sizeof where);
        /* a copied or renamed checkpoint directory is fine: only noted */
        fprintf(stderr, "kvrepro gate: note: %s: model '%.64s' is not the --model directory's "
                "name '%s'; the reference runs are named '%s'\n", where, e.runs[k].model,
                model_name, model_name);
        break;
    }

    kv_gate_fill_root(&rep, o->weight_seed, o->prompt_seed, 1, 1);
    /* only the CPU reference runs here */
    snprintf(rep.device, sizeof rep.device, "cpu only");
    rep.model_hash = kv_model_hash(&m);
    {
        const KvGateOptions go = ext_gate_options(o);
        st = kv_gate_record_tolerances(&go, &rep, &err);
    }
    if (st != KV_OK) goto cleanup;
    if (!o->quiet) ext_print_header(o, &e, &m, model_name, rep.model_hash, n_groups);
    st = ext_check_work(&e, groups, n_groups, &m, o, &err);
    if (st != KV_OK) goto cleanup;
    st = ext_run_references(&e, groups, n_groups, &m, model_name, o, &rep, &err);
    if (st == KV_OK) st = ext_check_reference_labels(&rep, rep.n_runs, &e, &err);
    if (st != KV_OK) goto cleanup;
    const int64_t first_ext = rep.n_runs, end_ext = first_ext + e.n;
    st = ext_append_runs(&rep, &e, &err);
    if (st == KV_OK) st = ext_calibrate(groups, n_groups, &m, model_name, o, &rep, &err);
    if (st == KV_OK) {
        st = ext_bf16_yardstick(groups, n_groups, group_of, first_ext, end_ext, model_name, &rep,
                                &err);
    }
    if (st == KV_OK) {
        ExtJudge j = {&m, model_name, o, 0};
        st = ext_judge(o, groups, group_of, first_ext, end_ext, &j, &rep, &failed, &err);
    }
    /* the count line last, once the files are safely written, as in the
     * matrix gate */
    /* nothing judged is a failure (cmd_gate.c): every run was skipped */
    char none[128] = "";
    if (n_groups == 0) {
        snprintf(none, sizeof none,
                 "the gate judged no external run: all %lld were recorded as skipped",
                 (long long)e.n);
    }
    if (st == KV_OK) {
        st = kv_gate_write_outputs(&rep, o->report_path, o->junit_path, o->timings, o->quiet,
                                   n_groups == 0 ? none : NULL, &err);
    }
    if (st == KV_OK && kv_report_print_counts(&rep, stdout) != KV_OK) {
        st = kv_error_set(&err, KV_ERR_INTERNAL, "cannot print the summary table");
    }
    if (st == KV_OK && n_groups == 0) {
        printf("FAIL: %s\n", none);
        failed = true;
    }
    if (st == KV_OK && failed) rc = KV_EXIT_GATE_FAIL;
cleanup:
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        rc = kv_cli_exit_code(st);
    }
    free(groups);
    free(group_of);
    ext_runs_free(&e);
    kv_model_free(&m);
    kv_report_free(&rep);
    return rc;
}
