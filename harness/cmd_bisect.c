/* cmd_bisect.c: `kvrepro bisect`: where do two recorded runs first part?
 *
 * From the probe hashes alone (DESIGN §6) it names the first step, batch
 * row, layer and probe at which the runs differ, with the tokens around it.
 * With --rerun it re-executes both runs up to that step with full probe
 * dumps and prints the first differing element of the located probe and of
 * its inputs (index, both values, ULP distance, max |A - B|), and stores
 * the dumps in the report's /bisect group. The rerun checks the hashes'
 * answer against the full values of every earlier probe and walks back to
 * the earliest that differs when they disagree (bisect_rerun), saying which
 * probe the hashes named and why it moved. Before any recorded index is
 * used, the two runs are checked against each other (model, shape, probe
 * layout, token ids) and, for --rerun, against the model the rerun will use
 * (model hash, vocabulary, the forward's probe layout, name for name): a
 * report that does not match is bad input, never a "does not reproduce".
 * Exit codes: 0 the runs agree, 1 a divergence was found, 2 bad input or
 * usage, 3 internal error. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bisect.h"
#include "bisect_h5.h"
#include "cli.h"
#include "compare.h"
#include "fixture.h"
#include "model.h"
#include "report.h"
#include "report_h5.h"

static void bisect_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro bisect REPORT.h5 [REPORT_B.h5] [--run A] [--run B] [--rerun]\n"
            "                      [--out PATH.h5] [--model DIR]\n\n"
            "Finds, from the recorded probe hashes, the first step, batch row, layer and\n"
            "probe at which run B differs from run A, and prints it with the tokens at that\n"
            "step. Without --run it bisects the report's first failing comparison. With two\n"
            "reports, A is in the first and B in the second (one --run names both).\n\n"
            "  --run SPEC   a run index (as in runs/NNNN) or its label\n"
            "               MODEL/SCENARIO/VARIANT[+FAULT]/BACKEND/MODE/rN\n"
            "  --rerun      re-execute both runs on their backends up to that step with full\n"
            "               dumps of the differing probe and its inputs (cpu: cuda keeps\n"
            "               hashes only); print the first differing element and write the\n"
            "               dumps to the /bisect group of the (first) report. When the full\n"
            "               values already differ before the probe the hashes named, the\n"
            "               earliest probe that differs is reported and dumped instead\n"
            "  --out PATH   write the report with /bisect there instead of over REPORT.h5\n"
            "  --model DIR  the checkpoint a non-fixture run used (fixtures are rebuilt from\n"
            "               the report's weight seed)\n"
            "Exit codes: 0 the runs agree, 1 they diverge, 2 bad input or usage, 3 internal.\n");
}

/* "MODEL/SCENARIO/VARIANT[+FAULT]/BACKEND/MODE/rN" */
static void bisect_run_label(const KvRun *r, char *out, size_t n) {
    char rl[192];
    kv_run_label(r, rl, sizeof rl);
    snprintf(out, n, "%.*s/%.*s/%s", KV_NAME_LEN, r->model, KV_NAME_LEN, r->scenario, rl);
}

/* Index of the run named by spec, or -1 with the error set. */
static int64_t bisect_find_run(const KvReport *rep, const char *path, const char *spec,
                               KvError *err) {
    const int64_t i = kv_report_find_run(rep, spec);
    if (i < 0) {
        kv_error_set(err, KV_ERR_INPUT, "%s: --run %s: no such run (%lld runs; an index, or a "
                     "label like gemma2-tiny/prompt_w/ring+tf32/cpu/graph/r0; see kvrepro show)",
                     path, spec, (long long)rep->n_runs);
    }
    return i;
}

static void bisect_print_tokens(const KvRun *a, const KvRun *b, int64_t step) {
    printf("tokens at step %" PRId64 ":", step);
    for (int64_t r = 0; r < a->batch; r++) {
        const int64_t i = step * a->batch + r;
        printf("%s row %" PRId64 ": A %d, B %d%s", r > 0 ? ";" : "", r, a->tokens[i], b->tokens[i],
               a->tokens[i] != b->tokens[i] ? " (differ)" : "");
    }
    printf("\n");
    if (step > 0 && a->switch_step > 0 && step == a->switch_step) {
        /* prefix reuse (a second request) or a speculative rollback */
        printf("fed at step %" PRId64 ": the state saved after %" PRId64 " prompt tokens "
               "restored, then %" PRId64 " tokens in one forward (the run's suffix: a second "
               "request's, or the accepted drafts after a rollback)\n",
               step, a->save_after, a->suffix_len);
    } else if (step > 0) {
        if (a->shift_step > 0 && step == a->shift_step) {
            printf("before step %" PRId64 ": the context shifted: positions %" PRId64
                   "..%" PRId64 " dropped, the later ones moved down by %" PRId64
                   " and their keys re-rotated\n",
                   step, a->shift_keep, a->shift_keep + a->shift_drop - 1, a->shift_drop);
        }
        printf("fed at step %" PRId64 ":", step);
        for (int64_t r = 0; r < a->batch; r++) {
            const int64_t i = (step - 1) * a->batch + r;
            printf("%s row %" PRId64 ": A %d, B %d", r > 0 ? ";" : "", r, a->tokens[i],
                   b->tokens[i]);
        }
        printf("\n");
    }
}

/* One probe's dumps compared and printed. kv_dim and next locate an
 * element of a cache probe (position, K or V, element). */
static void bisect_print_diff(const char *role, const char *name, const KvProbeDump *da,
                              const KvProbeDump *db, int64_t p, int64_t row, bool cache,
                              int64_t kv_dim, int64_t next) {
    KvBisectDiff d;
    kv_bisect_diff(da->data[p], da->len[p], db->data[p], db->len[p], da->batch, row, &d);
    printf("  %-9s %-18s ", role, name);
    if (d.shape_differs) {
        printf("shapes differ: %" PRId64 " vs %" PRId64 " floats per row\n", da->len[p], db->len[p]);
        return;
    }
    if (!d.differs) {
        printf("identical (%" PRId64 " floats per row)\n", d.len);
        return;
    }
    if (d.first_index < 0) {
        printf("row %" PRId64 " identical; other rows differ, max |A-B| %.6g\n", row, d.max_abs_diff);
        return;
    }
    char where[96] = "";
    if (cache) {
        const int64_t count = d.len / (2 * kv_dim);
        const int64_t entry = d.first_index / (2 * kv_dim);
        const int64_t in_entry = d.first_index % (2 * kv_dim);
        snprintf(where, sizeof where, " (position %" PRId64 " %s[%" PRId64 "])",
                 next - count + entry, in_entry < kv_dim ? "K" : "V", in_entry % kv_dim);
    }
    char ulp[32] = "n/a (NaN)";
    if (d.ulp >= 0) snprintf(ulp, sizeof ulp, "%" PRId64, d.ulp);
    printf("row %" PRId64 " element %" PRId64 "%s: A %.9g, B %.9g, ulp %s; max |A-B| %.6g\n", row,
           d.first_index, where, (double)d.value_a, (double)d.value_b, ulp, d.max_abs_diff);
}

/* "R.h5: runs/0012": where a run is, for messages. */
static void bisect_run_where(const char *path, int64_t i, char *out, size_t n) {
    snprintf(out, n, "%s: runs/%04" PRId64, path, i);
}

/* A report's model_hash is kv_model_hash of the gate's first model
 * (cmd_gate.c). It can be attributed to a run only in an unsharded gate
 * report whose first run is of that run's model: a shard may hold no run of
 * the first model, and a merged report ("merged N") holds its shards' runs
 * in shard order. */
static bool bisect_recorded_hash(const KvReport *rep, const KvRun *run, uint64_t *hash) {
    if (strcmp(rep->shard, "1/1") != 0 || rep->n_runs < 1 ||
        strncmp(rep->runs[0].model, run->model, KV_NAME_LEN) != 0) {
        return false;
    }
    *hash = rep->model_hash;
    return true;
}

/* Runs from two reports (the model names already agree): a fixture is
 * rebuilt from its report's weight seed, so the seeds must agree for a
 * fixture run; and the model hashes where both reports record the run's. */
static KvStatus bisect_check_same_model(const KvReport *rep_a, const char *path_a, const KvRun *a,
                                        const KvReport *rep_b, const char *path_b,
                                        const KvRun *b, KvError *err) {
    char name[KV_NAME_LEN + 1];
    memcpy(name, a->model, KV_NAME_LEN);
    name[KV_NAME_LEN] = '\0';
    KvFamily fam;
    KvFixtureSize size;
    const bool fixture = kv_fixture_lookup(name, &fam, &size, NULL) == KV_OK;
    if (fixture && rep_a->weight_seed != rep_b->weight_seed) {
        return kv_error_set(err, KV_ERR_INPUT, "%s and %s record fixture %s with different "
                            "weights (weight seed %llu vs %llu): the runs are of different models",
                            path_a, path_b, name, (unsigned long long)rep_a->weight_seed,
                            (unsigned long long)rep_b->weight_seed);
    }
    uint64_t ha = 0, hb = 0;
    if (bisect_recorded_hash(rep_a, a, &ha) && bisect_recorded_hash(rep_b, b, &hb) && ha != hb) {
        return kv_error_set(err, KV_ERR_INPUT, "%s and %s record %s with different model hashes "
                            "(0x%016" PRIx64 " vs 0x%016" PRIx64 "): the runs are of different "
                            "models", path_a, path_b, name, ha, hb);
    }
    return KV_OK;
}

/* The model both runs are re-run on: DIR of --model, or the fixture the
 * runs name, rebuilt from the first report's weight seed. */
typedef struct {
    KvFixtureModel fx;
    KvModel dir_model;
    const KvModel *m;
    bool fixture;
    char name[512];             /* in messages: the fixture name or DIR */
} BisectModel;

static KvStatus bisect_model_load(const char *model_dir, const KvReport *rep, const KvRun *run,
                                  BisectModel *bm, KvError *err) {
    KvStatus st;
    if (model_dir != NULL) {
        st = kv_model_load_dir(model_dir, &bm->dir_model, err);
        bm->m = &bm->dir_model;
        snprintf(bm->name, sizeof bm->name, "%s", model_dir);
    } else {
        snprintf(bm->name, sizeof bm->name, "%.*s", KV_NAME_LEN, run->model);
        bm->fixture = true;
        st = kv_fixture_load(bm->name, rep->weight_seed, &bm->fx, err);
        if (st != KV_OK) kv_error_prefix(err, "--rerun needs --model DIR for a checkpoint run");
        bm->m = &bm->fx.model;
    }
    return st;
}

static void bisect_model_free(BisectModel *bm) {
    kv_fixture_free(&bm->fx);
    kv_model_free(&bm->dir_model);
}

/* The rerun model is the one the report recorded, where it recorded its hash. */
static KvStatus bisect_check_model_hash(const BisectModel *bm, const KvReport *rep,
                                        const char *path, const KvRun *run, KvError *err) {
    uint64_t recorded = 0;
    if (!bisect_recorded_hash(rep, run, &recorded)) return KV_OK;
    const uint64_t have = kv_model_hash(bm->m);
    if (have == recorded) return KV_OK;
    char seed[48] = "";
    if (bm->fixture) {
        snprintf(seed, sizeof seed, " (weight seed %llu)", (unsigned long long)rep->weight_seed);
    }
    return kv_error_set(err, KV_ERR_INPUT, "%s: model_hash 0x%016" PRIx64 " recorded for %.64s, "
                        "%s%s has 0x%016" PRIx64 "; the report does not match this model", path,
                        recorded, run->model, bm->name, seed, have);
}

typedef struct {
    const char *path_a, *path_b;   /* report files (path_b may equal path_a) */
    const char *where_a, *where_b; /* "R.h5: runs/0012" */
    const KvReport *rep_a, *rep_b;
    const KvRun *a, *b;
    int64_t ia, ib;
    const char *out;
    const KvModel *m;              /* checked against both runs (kv_bisect_check_model) */
} BisectJob;

/* Both runs re-executed to one step, with their per-step digests. */
typedef struct {
    KvDecodeResult a, b;
    uint64_t *da, *db; /* (steps, n_probes, batch) digests of the full values; NULL without
                        * dumps (kv_bisect_rerun_digests) */
} BisectReruns;

static void bisect_reruns_free(BisectReruns *r) {
    kv_decode_result_free(&r->a);
    kv_decode_result_free(&r->b);
    free(r->da);
    free(r->db);
    memset(r, 0, sizeof *r);
}

static KvStatus bisect_reruns(const BisectJob *j, int64_t step, BisectReruns *out, KvError *err) {
    char prefix[1200];
    memset(out, 0, sizeof *out);
    KvStatus st = kv_bisect_rerun_digests(j->m, j->a, step, &out->a, &out->da, err);
    if (st != KV_OK) {
        snprintf(prefix, sizeof prefix, "rerun of A (%s)", j->where_a);
        kv_error_prefix(err, prefix);
        return st;
    }
    st = kv_bisect_rerun_digests(j->m, j->b, step, &out->b, &out->db, err);
    if (st != KV_OK) {
        snprintf(prefix, sizeof prefix, "rerun of B (%s)", j->where_b);
        kv_error_prefix(err, prefix);
        bisect_reruns_free(out);
    }
    return st;
}

/* Whether probe p differs in any row at `step` of the digests. */
static bool bisect_digest_differs(const BisectReruns *r, int64_t NP, int64_t B, int64_t step,
                                  int64_t p) {
    for (int64_t row = 0; row < B; row++) {
        const int64_t i = (step * NP + p) * B + row;
        if (r->da[i] != r->db[i]) return true;
    }
    return false;
}

/* Says why the rerun moved the first divergence from `named` (what the
 * recorded hashes named) to `at` (the earliest probe whose rerun values
 * differ): what differs before the named probe, and why no recorded hash
 * showed it. */
static void bisect_print_walk_back(const BisectJob *j, const BisectReruns *r,
                                   const KvBisectPoint *named, const KvBisectPoint *at) {
    const int64_t NP = j->a->n_probes, B = j->a->batch;
    char (*names)[KV_NAME_LEN] = j->a->probe_names;
    printf("localisation inconsistent: the recorded hashes named step %" PRId64 ", row %" PRId64
           ", probe %.*s (probe %" PRId64 "), but the rerun's full values already differ before "
           "it:", named->step, named->row, KV_NAME_LEN, names[named->probe], named->probe);
    int64_t in[2];
    const int n_in = kv_bisect_inputs(NP, named->probe, in);
    int shown = 0;
    for (int k = 0; k < n_in; k++) {
        if (!bisect_digest_differs(r, NP, B, named->step, in[k])) continue;
        printf("%s %.*s", shown++ == 0 ? " its input" : " and", KV_NAME_LEN, names[in[k]]);
    }
    if (shown > 0) {
        printf(" %s at step %" PRId64 ";", shown == 1 ? "differs" : "differ", named->step);
    }
    printf(" the earliest difference is %.*s (probe %" PRId64 ") at step %" PRId64 ", row %" PRId64
           ", %s\n", KV_NAME_LEN, names[at->probe], at->probe, at->step, at->row,
           at->step < named->step ? "an earlier step"
           : at->probe < named->probe ? "earlier in the step's probe order"
                                      : "an earlier row of it");
    /* The recorded hashes agreed at `at` (or they would have named it): the
     * rerun's own hashes say whether the recording or the hash is at fault. */
    const int64_t i = (at->step * NP + at->probe) * B + at->row;
    const uint64_t rec_a = j->a->probe_hash[i], rec_b = j->b->probe_hash[i];
    const uint64_t run_a = r->a.probe_hash[i], run_b = r->b.probe_hash[i];
    if (run_a == run_b) {
        printf("  why the hashes missed it: the rerun's probe hashes of %.*s agree too although "
               "its values differ: the probe hash does not cover the values that differ (a "
               "hash over part of the tensor)\n", KV_NAME_LEN, names[at->probe]);
    } else {
        const char *who = rec_a != run_a && rec_b != run_b ? "A's and B's"
                          : rec_a != run_a                 ? "A's"
                                                           : "B's";
        printf("  why the hashes missed it: the rerun's probe hashes of %.*s differ, the "
               "recorded ones %s; %s recorded hash there is not the one its rerun computes (a "
               "report from another build, or an edited one)\n", KV_NAME_LEN, names[at->probe],
               rec_a == rec_b ? "agree" : "differ", who);
    }
    printf("walking back: the rerun's full values compared, in execution order, for every "
           "probe up to %.*s at step %" PRId64, KV_NAME_LEN, names[named->probe], named->step);
    if (named->step == 1) printf(" and every probe of step 0");
    if (named->step > 1) printf(" and every probe of steps 0..%" PRId64, named->step - 1);
    printf("; the earliest that differs is the first divergence\n");
}

/* Re-runs both runs to pt->step, checks the localisation from the hashes
 * against the rerun's full values, walks back to the earliest probe whose
 * values differ when they disagree, prints the element-wise differences of
 * that probe and its inputs, and writes /bisect. The runs' probe layouts
 * are the model's (checked before), so recorded indices are rerun indices.
 *
 * The walk back is bounded and deterministic: the first reruns (to the
 * named step) digest every probe of every step up to it, so one scan in
 * execution order (step, probe order, row) finds the earliest difference at
 * or before the named probe, wherever it is: an input of the named probe,
 * anything earlier in the step, or an earlier step, which a step-by-step
 * walk could miss when a difference stays in probes that later steps do
 * not read (the last layer, the logits) or slides out of the window. When
 * that point is at an earlier step, both runs are re-run once more to it for
 * its full values (the decode keeps the last step's only), and its digests
 * must be those of the first reruns. At most four decodes of at most
 * pt->step + 1 steps, each a pure function of the recorded run. */
static KvStatus bisect_rerun(const BisectJob *j, const KvBisectPoint *pt, KvError *err) {
    BisectReruns first, back;
    memset(&back, 0, sizeof back);
    KvStatus st = bisect_reruns(j, pt->step, &first, err);
    if (st != KV_OK) return st;
    const BisectReruns *at_r = &first;
    const int64_t NP = j->a->n_probes, B = j->a->batch;
    const int64_t last = (pt->step * NP + pt->probe) * B + pt->row;     /* in the recording */
    const int64_t here = ((first.a.steps - 1) * NP + pt->probe) * B + pt->row; /* in the rerun */
    const bool same_a = first.a.probe_hash[here] == j->a->probe_hash[last];
    const bool same_b = first.b.probe_hash[here] == j->b->probe_hash[last];
    printf("rerun to step %" PRId64 ": A %s its recorded hash there, B %s\n", pt->step,
           same_a ? "reproduces" : "does NOT reproduce", same_b ? "reproduces" : "does NOT reproduce");
    if (!same_a || !same_b) {
        /* Layouts, model and inputs were checked: what is left is the run
         * itself, or a build that computes it differently. */
        const KvReport *other = strcmp(j->rep_a->git_commit, KV_GIT_COMMIT) != 0 ? j->rep_a
                                                                                  : j->rep_b;
        if (strcmp(other->git_commit, KV_GIT_COMMIT) != 0 ||
            strcmp(KV_GIT_COMMIT, "unknown") == 0) {
            printf("  (recorded by commit %.64s, re-run by commit %s: a changed build may compute "
                   "it differently; if not, the run is nondeterministic: repeat the rerun)\n",
                   other->git_commit, KV_GIT_COMMIT);
        } else {
            printf("  (a run that does not reproduce is itself nondeterministic: repeat the "
                   "rerun)\n");
        }
    }
    if (first.a.dump.data == NULL || first.b.dump.data == NULL || first.da == NULL ||
        first.db == NULL) {
        /* A backend without probe dumps (cuda) reruns to the hashes alone. */
        printf("dumps: none: the %.16s backend keeps no probe values; the hashes above are what "
               "its rerun shows\n", first.a.dump.data == NULL ? j->a->backend : j->b->backend);
        goto cleanup;
    }
    KvBisectPoint at;
    kv_bisect_walk_back(first.da, first.db, NP, B, pt, &at);
    if (at.step < 0) {
        printf("rerun: the full values agree up to and including step %" PRId64 ", row %" PRId64
               ", probe %.*s: the rerun does not show this divergence\n", pt->step, pt->row,
               KV_NAME_LEN, j->a->probe_names[pt->probe]);
        at = *pt;
    } else if (at.step != pt->step || at.probe != pt->probe || at.row != pt->row) {
        bisect_print_walk_back(j, &first, pt, &at);
        char layer[32] = "";
        if (at.layer >= 0) snprintf(layer, sizeof layer, ", layer %" PRId64, at.layer);
        printf("first divergence (rerun values): step %" PRId64 ", row %" PRId64 "%s, probe %.*s "
               "(probe %" PRId64 " of %" PRId64 "; the hashes named %.*s, probe %" PRId64
               " at step %" PRId64 ")\n", at.step, at.row, layer, KV_NAME_LEN,
               j->a->probe_names[at.probe], at.probe, NP, KV_NAME_LEN,
               j->a->probe_names[pt->probe], pt->probe, pt->step);
        if (at.step < pt->step) {
            bisect_print_tokens(j->a, j->b, at.step);
            st = bisect_reruns(j, at.step, &back, err);
            if (st != KV_OK) goto cleanup;
            const size_t n = (size_t)((at.step + 1) * NP * B) * sizeof *first.da;
            const bool again_a = back.da != NULL && memcmp(back.da, first.da, n) == 0;
            const bool again_b = back.db != NULL && memcmp(back.db, first.db, n) == 0;
            printf("rerun to step %" PRId64 ": A %s the first rerun's values there, B %s%s\n",
                   at.step, again_a ? "reproduces" : "does NOT reproduce",
                   again_b ? "reproduces" : "does NOT reproduce",
                   again_a && again_b ? "" : " (a run that does not reproduce is itself "
                                             "nondeterministic: repeat the rerun)");
            if (back.a.dump.data == NULL || back.b.dump.data == NULL) {
                st = kv_error_set(err, KV_ERR_INTERNAL, "rerun to step %" PRId64 ": no dumps",
                                  at.step);
                goto cleanup;
            }
            at_r = &back;
        }
    }
    const KvConfig *c = &j->m->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    /* positions stored after the step (a prefix-reuse run's second request
     * restarts from its saved prefix at the switch) */
    const KvRun *ra = j->a;
    const int64_t next = ra->switch_step > 0 && at.step >= ra->switch_step
                             ? ra->save_after + ra->suffix_len + (at.step - ra->switch_step)
                             : ra->prompt_len + at.step;
    int64_t probes[3] = {at.probe, -1, -1};
    const int n_in = kv_bisect_inputs(NP, at.probe, probes + 1);
    KvBisectTensorOut tensors[3];
    const KvProbeDump *da = &at_r->a.dump, *db = &at_r->b.dump;
    for (int k = 0; k < 1 + n_in; k++) {
        const int64_t p = probes[k];
        const bool cache = kv_probe_item(NP, p) == KV_PROBE_CACHE;
        bisect_print_diff(k == 0 ? "diverged" : "input", j->a->probe_names[p], da, db, p, at.row,
                          cache, kv_dim, next);
        tensors[k] = (KvBisectTensorOut){p, j->a->probe_names[p], k == 0 ? "diverged" : "input",
                                         B, da->len[p], db->len[p], da->data[p], db->data[p]};
    }
    char la[512], lb[512], ra_label[320], rb_label[320];
    bisect_run_label(j->a, ra_label, sizeof ra_label);
    bisect_run_label(j->b, rb_label, sizeof rb_label);
    snprintf(la, sizeof la, "%s:runs/%04" PRId64 " %s", j->path_a, j->ia, ra_label);
    snprintf(lb, sizeof lb, "%s:runs/%04" PRId64 " %s", j->path_b, j->ib, rb_label);
    const KvBisectRecord rec = {la, lb, at.step, at.row, at.probe, j->a->probe_names[at.probe],
                                tensors, 1 + n_in, pt->step, pt->row, pt->probe,
                                j->a->probe_names[pt->probe]};
    const char *dst = j->out != NULL ? j->out : j->path_a;
    st = kv_bisect_write_h5(j->path_a, dst, &rec, err);
    if (st == KV_OK) printf("dumps: %s /bisect\n", dst);
cleanup:
    bisect_reruns_free(&first);
    bisect_reruns_free(&back);
    return st;
}

int kv_cmd_bisect(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL}, *runs[2] = {NULL, NULL};
    const char *out = NULL, *model_dir = NULL;
    int n_paths = 0, n_runs = 0;
    bool rerun = false, bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            bisect_usage(stdout);
            return KV_EXIT_PASS;
        } else if (strcmp(argv[i], "--rerun") == 0) {
            rerun = true;
        } else if (kv_cli_take(argc, argv, &i, "--run", &v, &bad)) {
            if (!bad && n_runs == 2) {
                fprintf(stderr, "kvrepro bisect: at most two --run\n");
                bad = true;
            }
            if (!bad) runs[n_runs++] = v;
        } else if (kv_cli_take(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else if (kv_cli_take(argc, argv, &i, "--model", &v, &bad)) {
            model_dir = v;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "kvrepro bisect: unknown option '%s'\n", argv[i]);
            bad = true;
        } else if (n_paths == 2) {
            fprintf(stderr, "kvrepro bisect: at most two reports\n");
            bad = true;
        } else {
            paths[n_paths++] = argv[i];
        }
    }
    if (!bad && n_paths == 0) {
        fprintf(stderr, "kvrepro bisect: expected a report\n");
        bad = true;
    }
    if (!bad && n_paths == 2 && n_runs == 0) {
        fprintf(stderr, "kvrepro bisect: with two reports, name the runs with --run\n");
        bad = true;
    }
    if (!bad && n_paths == 1 && n_runs == 1) {
        fprintf(stderr, "kvrepro bisect: with one report, give two --run (or none: the first "
                "failing comparison)\n");
        bad = true;
    }
    if (bad) {
        bisect_usage(stderr);
        return KV_EXIT_USAGE;
    }

    KvError err = {{0}};
    KvReport rep[2];
    memset(rep, 0, sizeof rep);
    BisectModel bm;
    memset(&bm, 0, sizeof bm);
    int rc = KV_EXIT_PASS;
    KvStatus st = kv_report_read_h5(paths[0], &rep[0], &err);
    if (st == KV_OK && n_paths == 2) st = kv_report_read_h5(paths[1], &rep[1], &err);
    if (st != KV_OK) goto cleanup;
    const KvReport *rb_rep = n_paths == 2 ? &rep[1] : &rep[0];
    int64_t ia = -1, ib = -1;
    if (n_runs == 0) {
        for (int64_t c = 0; c < rep[0].n_comparisons && ia < 0; c++) {
            if (rep[0].comparisons[c].verdict != KV_VERDICT_FAIL) continue;
            ia = rep[0].comparisons[c].run_a;
            ib = rep[0].comparisons[c].run_b;
        }
        if (ia < 0) {
            printf("bisect: %s: every comparison passed; nothing to bisect (name runs with "
                   "--run A --run B)\n", paths[0]);
            goto cleanup;
        }
    } else {
        ia = bisect_find_run(&rep[0], paths[0], runs[0], &err);
        if (ia < 0) {
            st = KV_ERR_INPUT;
            goto cleanup;
        }
        ib = bisect_find_run(rb_rep, n_paths == 2 ? paths[1] : paths[0], runs[n_runs - 1], &err);
        if (ib < 0) {
            st = KV_ERR_INPUT;
            goto cleanup;
        }
    }
    const KvRun *a = &rep[0].runs[ia], *b = &rb_rep->runs[ib];
    const char *path_b = n_paths == 2 ? paths[1] : paths[0];
    char la[320], lb[320];
    bisect_run_label(a, la, sizeof la);
    bisect_run_label(b, lb, sizeof lb);
    printf("A: %s runs/%04" PRId64 " %s\n", paths[0], ia, la);
    printf("B: %s runs/%04" PRId64 " %s\n", path_b, ib, lb);
    /* Everything an index will rely on is checked before the first one is
     * taken: the runs against each other, and for --rerun against the model
     * the rerun will produce probes for. */
    char where_a[600], where_b[600];
    bisect_run_where(paths[0], ia, where_a, sizeof where_a);
    bisect_run_where(path_b, ib, where_b, sizeof where_b);
    st = kv_bisect_check_pair(a, where_a, b, where_b, &err);
    if (st == KV_OK && n_paths == 2) {
        st = bisect_check_same_model(&rep[0], paths[0], a, rb_rep, path_b, b, &err);
    }
    if (st == KV_OK && rerun) st = kv_bisect_check_rerunnable(a, where_a, &err);
    if (st == KV_OK && rerun) st = kv_bisect_check_rerunnable(b, where_b, &err);
    /* The report the rerun writes: its destination must be one a file can
     * be published at, and a /bisect it already has one that can be
     * replaced, both found before the rerun rather than after it. */
    if (st == KV_OK && rerun) st = kv_report_check_writable(out != NULL ? out : paths[0], &err);
    if (st == KV_OK && rerun) st = kv_bisect_check_h5(paths[0], &err);
    if (st == KV_OK && rerun) {
        st = bisect_model_load(model_dir, &rep[0], a, &bm, &err);
        if (st == KV_OK) st = bisect_check_model_hash(&bm, &rep[0], paths[0], a, &err);
        if (st == KV_OK && n_paths == 2) st = bisect_check_model_hash(&bm, rb_rep, path_b, b, &err);
        if (st == KV_OK) st = kv_bisect_check_model(a, where_a, bm.m, bm.name, &err);
        if (st == KV_OK) st = kv_bisect_check_model(b, where_b, bm.m, bm.name, &err);
    }
    if (st != KV_OK) goto cleanup;
    KvBisectPoint pt;
    st = kv_bisect_find(a, b, &pt, &err);
    if (st != KV_OK) goto cleanup;
    if (pt.step < 0) {
        printf("no divergence: %" PRId64 " steps x %" PRId64 " probes x %" PRId64
               " rows identical\n", a->steps, a->n_probes, a->batch);
        goto cleanup;
    }
    rc = KV_EXIT_GATE_FAIL;
    if (pt.by_tokens) {
        printf("first divergence: step %" PRId64 ", row %" PRId64
               " (tokens or logits; no probe hashes recorded)\n", pt.step, pt.row);
    } else {
        char layer[32] = "";
        if (pt.layer >= 0) snprintf(layer, sizeof layer, ", layer %" PRId64, pt.layer);
        printf("first divergence: step %" PRId64 ", row %" PRId64 "%s, probe %.*s (probe %" PRId64
               " of %" PRId64 "; the %" PRId64 " before it agree)\n",
               pt.step, pt.row, layer, KV_NAME_LEN, a->probe_names[pt.probe], pt.probe,
               a->n_probes, pt.probe);
    }
    bisect_print_tokens(a, b, pt.step);
    if (rerun) {
        if (pt.by_tokens) {
            /* The layouts are the model's, so probes were recorded: they
             * agree, and only tokens or logits hashes differ. */
            st = kv_error_set(&err, KV_ERR_INPUT, "--rerun: %s and %s agree in every probe hash; "
                              "they differ only in tokens or logits hashes (step %" PRId64
                              ", row %" PRId64 "), which no probe dump can locate", where_a,
                              where_b, pt.step, pt.row);
            goto cleanup;
        }
        const BisectJob job = {paths[0], path_b, where_a, where_b, &rep[0], rb_rep, a, b, ia, ib,
                               out, bm.m};
        st = bisect_rerun(&job, &pt, &err);
    }
cleanup:
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro bisect: %s\n", err.msg);
        rc = kv_cli_exit_code(st);
    }
    bisect_model_free(&bm);
    kv_report_free(&rep[0]);
    kv_report_free(&rep[1]);
    return rc;
}
