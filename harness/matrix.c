/* matrix.c: running the gate matrix and recording it (see matrix.h). */
#include "matrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"
#include "ensemble.h"
#include "fault.h"
#include "forward.h"
#include "prefill_tape.h"
#include "stream_tape.h"
#include "rate.h"
#include "kv_limits.h"
#include "prng.h"
#include "shadow64.h"

double kv_gate_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t kv_gate_add_run(KvReport *rep) {
    KvRun *runs = realloc(rep->runs, (size_t)(rep->n_runs + 1) * sizeof *runs);
    if (runs == NULL) return -1;
    rep->runs = runs;
    kv_run_init(&runs[rep->n_runs]);
    return rep->n_runs++;
}

KvStatus kv_gate_add_comparison(KvReport *rep, const KvComparison *c, KvError *err) {
    KvComparison *cs = realloc(rep->comparisons, (size_t)(rep->n_comparisons + 1) * sizeof *cs);
    if (cs == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    rep->comparisons = cs;
    cs[rep->n_comparisons++] = *c;
    return KV_OK;
}

void kv_run_identify(KvRun *r, const char *model, const char *scenario, const char *variant,
                     const char *backend, const char *mode, int repeat, unsigned faults) {
    kv_fault_names(faults, r->fault, sizeof r->fault);
    snprintf(r->model, sizeof r->model, "%s", model);
    snprintf(r->scenario, sizeof r->scenario, "%s", scenario);
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    snprintf(r->backend, sizeof r->backend, "%s", backend);
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    r->repeat = repeat;
}

KvStatus kv_run_from_result(KvRun *run, const KvConfig *cfg, const KvDecodeSpec *spec,
                            const KvScript *script, KvDecodeResult *res, KvError *err) {
    const KvScript none = {0};
    const KvScript *sc = script != NULL ? script : &none;
    KvStatus st = KV_OK;
    const int64_t B = res->batch, S = res->steps, V = res->vocab, P = spec->prompt_len;
    run->steps = S;
    run->batch = B;
    run->vocab = V;
    run->prompt_len = P;
    run->prefill_chunk = spec->prefill_chunk;
    run->save_after = sc->save_after;
    run->switch_step = sc->switch_step;
    run->suffix_len = sc->suffix_len;
    run->shift_step = sc->shift_step;
    run->shift_keep = sc->shift_keep;
    run->shift_drop = sc->shift_drop;
    run->prompt = malloc((size_t)(B * P) * sizeof *run->prompt);
    run->prompt_real = malloc((size_t)(B * P));
    run->logits_hash = malloc((size_t)(S * B) * sizeof *run->logits_hash);
    /* a run without probes (another engine's) holds no names either */
    if (res->n_probes > 0) {
        run->probe_names = calloc((size_t)res->n_probes, sizeof *run->probe_names);
    }
    if (sc->suffix != NULL) {
        run->suffix = malloc((size_t)(B * sc->suffix_len) * sizeof *run->suffix);
    }
    if (!run->prompt || !run->prompt_real || !run->logits_hash ||
        (res->n_probes > 0 && !run->probe_names) || (sc->suffix != NULL && !run->suffix)) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory recording a run");
        goto cleanup;
    }
    memcpy(run->prompt, spec->prompt, (size_t)(B * P) * sizeof *run->prompt);
    memcpy(run->prompt_real, spec->prompt_real, (size_t)(B * P));
    if (sc->suffix != NULL) {
        memcpy(run->suffix, sc->suffix, (size_t)(B * sc->suffix_len) * sizeof *run->suffix);
    }
    for (int64_t i = 0; i < S * B; i++) {
        run->logits_hash[i] =
            kv_fnv1a(KV_FNV_OFFSET, res->logits + i * V, (size_t)V * sizeof(float));
    }
    for (int64_t p = 0; p < res->n_probes; p++) {
        kv_probe_name(cfg, p, run->probe_names[p], KV_NAME_LEN);
    }
    /* Take ownership of the result's arrays. */
    run->tokens = res->tokens;
    run->logits = res->logits;
    run->margins = res->margins;
    run->n_probes = res->n_probes;
    run->probe_hash = res->probe_hash;
    res->tokens = NULL;
    res->logits = NULL;
    res->margins = NULL;
    res->probe_hash = NULL;
    run->graphs_captured = res->graphs_captured;
    run->replays_checked = res->replays_checked;
    run->replay_mismatch_step = res->replay_mismatch_step;
    run->nonfinite_checked = res->nonfinite_checked;
    run->nonfinite_step = res->nonfinite_step;
    run->nonfinite_probe = res->nonfinite_probe;
    run->nonfinite_row = res->nonfinite_row;
    run->nonfinite_index = res->nonfinite_index;
    run->nonfinite_value = res->nonfinite_value;
cleanup:
    kv_decode_result_free(res);
    return st;
}

/* The graph budget of a graph-mode decode of sc with `variant` (the
 * variant's own rule, KvCacheOps.graph_budget) on model m. The capture key
 * holds every sliding layer's regime and length. Layers of one window change
 * their keys at the same steps, so a model whose sliding layers share one
 * window needs what one layer needs. Layers of different windows (mistral's
 * list form of sliding_window) change at their own steps: the budget is one
 * graph plus every distinct window's re-captures, exact when their steps
 * differ and an upper bound when some coincide, never more than one graph
 * per decode step. A model without sliding layers never changes its key. */
static int64_t run_graph_budget(const KvModel *m, const KvScenario *sc,
                                const KvCacheOps *variant) {
    const int64_t decode_steps = sc->new_tokens - 1; /* step 0 comes from the prefill */
    if (decode_steps <= 0) return 0;
    /* A right-padded batch (per-row positions): each row's caches change
     * their keys at the row's own steps, from the row's own prompt length
     * (its columns up to its last real token); else one length for all. */
    const bool per_row = kv_decode_right_padded(sc->real, sc->batch, sc->prompt_len);
    int64_t seen[KV_MAX_LAYERS];
    int64_t n_seen = 0, recaptures = 0;
    for (int64_t l = 0; l < m->config.num_layers && l < KV_MAX_LAYERS; l++) {
        const int64_t w = kv_config_layer_window(&m->config, l);
        bool again = w == 0;
        for (int64_t k = 0; k < n_seen && !again; k++) again = seen[k] == w;
        if (again) continue;
        seen[n_seen++] = w;
        for (int64_t b = 0; b < (per_row ? sc->batch : 1); b++) {
            int64_t len = sc->prompt_len;
            while (per_row && len > 1 && !sc->real[b * sc->prompt_len + len - 1]) len--;
            recaptures += variant->graph_budget(w, len, decode_steps) - 1;
        }
    }
    return 1 + (recaptures < decode_steps - 1 ? recaptures : decode_steps - 1);
}

static double keys_attended(int64_t T, int64_t W);

/* The (query, key) pairs a decode of sc attends with `steps` new tokens,
 * summed over the rows and the layers: each row's real tokens (a pad query
 * attends to nothing) and the tokens it is fed after them, less the pairs
 * of the first `shared` prompt columns (a candidate that takes the
 * reference's first prefill forward does not attend them again). */
static double run_keys_steps(const KvConfig *cfg, const KvScenario *sc, int64_t steps,
                             int64_t shared) {
    double keys = 0.0;
    for (int64_t b = 0; b < sc->batch; b++) {
        int64_t real = 0, real_shared = 0;
        for (int64_t t = 0; t < sc->prompt_len; t++) {
            const bool r = sc->real[b * sc->prompt_len + t] != 0;
            real += r;
            real_shared += r && t < shared;
        }
        for (int64_t l = 0; l < cfg->num_layers; l++) {
            const int64_t W = kv_config_layer_window(cfg, l);
            keys += keys_attended(real + steps - 1, W) - keys_attended(real_shared, W);
        }
    }
    return keys;
}

/* The pairs of one row's prefill of n tokens (a stream, stream_tape.h). */
static double prefill_keys(const KvConfig *cfg, int64_t n) {
    double keys = 0.0;
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        keys += keys_attended(n, kv_config_layer_window(cfg, l));
    }
    return keys;
}

/* The pairs of a whole decode of sc. */
static double run_keys(const KvConfig *cfg, const KvScenario *sc) {
    return run_keys_steps(cfg, sc, sc->new_tokens, 0);
}

/* A running decode's share of the gate's estimated work. */
typedef struct {
    const KvGateOptions *o;
    const KvRun *run; /* its identity, for the progress line */
    const KvConfig *cfg;
    int64_t batch;
    bool seq;         /* a member in the sequential order */
    double keys, est; /* the whole run's attention pairs and estimated seconds */
    int64_t fed;      /* the positions a row is fed in the whole run */
} RunProgress;

static void run_progress(void *ctx, int64_t columns, int64_t steps) {
    const RunProgress *p = ctx;
    /* the attention's pairs grow with the square of the positions fed
     * until the window is full: the square is the nearer guess of the two
     * for the long prompts where attention is what costs */
    const double f = p->fed > 0 ? (double)(columns + steps) / (double)p->fed : 1.0;
    const double so_far = kv_rate_decode_seconds(p->cfg, p->o->rate, p->batch * columns, steps,
                                                 p->batch, p->keys * (f < 1.0 ? f * f : 1.0),
                                                 p->seq);
    *p->o->est_running = so_far < p->est ? so_far : p->est;
    char cur[320];
    snprintf(cur, sizeof cur, "%s %s %s/%s/%s/r%d (step %lld)", p->run->model, p->run->scenario,
             p->run->variant, p->run->backend, p->run->mode, (int)p->run->repeat,
             (long long)steps);
    kv_gate_progress_print(p->o, cur, false);
}

/* The columns of a scenario's first prefill forward (the whole prompt, its
 * first chunk, or the columns before a prefix entry). */
static int64_t first_forward_columns(const KvScenario *sc) {
    int64_t n = sc->prompt_len;
    if (sc->prefill_chunk > 0 && sc->prefill_chunk < n) n = sc->prefill_chunk;
    if (kv_scenario_switches(sc) && sc->save_after > 0 && sc->save_after < n) n = sc->save_after;
    return n;
}

/* Decodes sc on backend ops and fills run (identity already set). forced:
 * (steps, B) or NULL. KV_SKIP when the backend cannot run here. A variant's
 * graph-mode run records its graph budget; eager runs and the reference
 * capture nothing and record none. tape (NULL: none): the scenario's
 * prefill tape (prefill_tape.h), recorded by the reference's run and taken
 * by a variant's where it fits. */
static KvStatus run_decode(const KvModel *m, const KvScenario *sc, const KvCacheOps *variant,
                           KvExecMode mode, const KvGateOptions *o, const int32_t *forced,
                           const KvBackendOps *ops, unsigned order, KvPrefillTape *tape,
                           const KvPrefillTape *play, KvRun *run, KvError *err) {
    /* the script only when it switches inside this decode (what the run
     * records, so a rerun from the report does the same) */
    KvScript script = kv_script_of_scenario(sc);
    if (!kv_scenario_switches(sc)) {
        script.save_after = script.switch_step = script.suffix_len = 0;
        script.suffix = NULL;
    }
    KvDecodeSpec spec = {
        .batch = sc->batch,
        .prompt_len = sc->prompt_len,
        .prompt = sc->prompt,
        .prompt_real = sc->real,
        .new_tokens = sc->new_tokens,
        .prefill_chunk = sc->prefill_chunk,
        .forced = forced,
        .variant = variant,
        .mode = mode,
        .faults = variant != NULL ? o->faults : 0,
        .order = order,
        .replay_every = variant != NULL ? o->replay_every : 0,
        .record_probes = true,
        .tape_record = variant == NULL && order == 0 ? tape : NULL,
        .tape_play = variant != NULL ? tape : play,
    };
    /* progress during the run, by its estimated cost */
    RunProgress rp = {o, run, &m->config, sc->batch, (order & KV_ORDER_DOT_SEQUENTIAL) != 0, 0.0,
                      0.0, sc->prompt_len + sc->new_tokens - 1};
    if (o->rate != NULL && o->est_done != NULL && ops->host) {
        const KvPrefillTape *took = variant != NULL ? tape : play;
        const bool taped = took != NULL && took->filled;
        const int64_t cols = taped ? sc->prompt_len - took->n : sc->prompt_len;
        rp.keys = run_keys_steps(&m->config, sc, sc->new_tokens, taped ? took->n : 0);
        rp.est = kv_rate_decode_seconds(&m->config, o->rate, sc->batch * cols,
                                        sc->new_tokens - 1, sc->batch, rp.keys,
                                        (order & KV_ORDER_DOT_SEQUENTIAL) != 0);
        spec.on_progress = run_progress;
        spec.on_progress_ctx = &rp;
    }
    KvDecodeResult res;
    const double t0 = kv_gate_now();
    KvStatus st = kv_script_bind(&script, m, &spec, err);
    if (st == KV_OK) st = kv_decode_run(ops, m, &spec, &res, NULL, err);
    if (o->est_done != NULL) {
        *o->est_done += rp.est;
        *o->est_running = 0.0;
    }
    if (st != KV_OK) return st;
    const double t1 = kv_gate_now();
    st = kv_run_from_result(run, &m->config, &spec, &script, &res, err);
    if (st != KV_OK) return st;
    if (variant != NULL && mode == KV_MODE_GRAPH) {
        run->graph_budget = run_graph_budget(m, sc, variant);
    }
    /* Always measured: JUnit's durations. kv_gate_write_outputs keeps it
     * out of the HDF5 report unless --timings, so the report's bytes stay
     * a function of the inputs. */
    run->seconds = t1 - t0;
    /* a prompts file with texts: every run of its batch carries them */
    if (sc->texts != NULL) {
        run->prompt_text = kv_prompt_text_copy(sc->texts, sc->batch);
        if (run->prompt_text == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        snprintf(run->tokenizer, sizeof run->tokenizer, "%s", sc->tokenizer);
    }
    return KV_OK;
}

/* Index of the run (variant, mode, repeat) among the candidate runs of
 * this scenario, laid out as [variant][mode][repeat]; -1 when absent. */
typedef struct {
    int64_t *index; /* (n_variants, 2, repeats) run index or -1 */
    int repeats;
} CandidateTable;

static int64_t *cand_slot(CandidateTable *t, int v, int mode, int rep) {
    return &t->index[((int64_t)v * 2 + mode) * t->repeats + rep];
}

/* Candidate runs per unit on the backends that can run (host_only: those
 * that run on this machine's CPU). */
static int64_t gate_candidate_runs(const KvGateOptions *o, bool host_only) {
    const int64_t modes = (o->eager ? 1 : 0) + (o->graph ? 1 : 0);
    int64_t runs = 0;
    for (int i = 0; i < o->n_backends; i++) {
        const KvGateBackend *gb = &o->backends[i];
        if (gb->skip[0] != '\0' || (host_only && !gb->ops->host)) continue;
        runs += (int64_t)o->n_variants * modes * o->repeats;
    }
    return runs;
}

bool kv_gate_unit_in_shard(const KvGateOptions *o, int64_t u) {
    return o->shard_n >= 1 && u % o->shard_n == o->shard_i - 1;
}

/* Counts n planned runs as accounted for (made, or skipped with a reason). */
static void account_runs(const KvGateOptions *o, int64_t n) {
    if (o->runs_accounted != NULL) *o->runs_accounted += n;
}

int64_t kv_gate_runs_per_unit(const KvGateOptions *o) {
    return 1 + (o->calibrate ? KV_ENSEMBLE_SIZE : 0) + gate_candidate_runs(o, false);
}

int64_t kv_gate_runs_planned_per_unit(const KvGateOptions *o) {
    const int64_t modes = (o->eager ? 1 : 0) + (o->graph ? 1 : 0);
    return 1 + (o->calibrate ? KV_ENSEMBLE_SIZE : 0) +
           (int64_t)o->n_backends * o->n_variants * modes * o->repeats;
}

void kv_gate_progress_print(const KvGateOptions *o, const char *current, bool final) {
    if (o->progress == KV_PROGRESS_OFF || o->runs_done == NULL) return;
    const double now = kv_gate_now(), elapsed = now - o->started;
    const int64_t done = *o->runs_done, total = o->runs_total;
    if (o->progress == KV_PROGRESS_TTY) {
        fprintf(stderr, "\r[%lld/%lld] %s  %.1fs   %s", (long long)done, (long long)total,
                current, elapsed, final ? "\n" : "");
        fflush(stderr);
        return;
    }
    if (!final && o->progress_last != NULL && now - *o->progress_last < o->progress_every) {
        return;
    }
    if (o->progress_last != NULL) *o->progress_last = now;
    char eta[48] = "";
    /* --first-catch: the fault passes stop early, so the total is a bound */
    const char *bound = o->stop_at_catch ? "<= " : "";
    const double est = o->est_done != NULL ? *o->est_done + *o->est_running : 0.0;
    if (!final && o->est_total > 0.0 && est > 0.0) {
        /* the estimate's remaining work at the speed measured so far */
        const double left = o->est_total > est ? o->est_total - est : 0.0;
        snprintf(eta, sizeof eta, ", ETA %s%.0fs", bound, left * elapsed / est);
    } else if (!final && done > 0 && total > done) {
        snprintf(eta, sizeof eta, ", ETA %s%.0fs", bound,
                 elapsed / (double)done * (double)(total - done));
    }
    fprintf(stderr, "kvrepro gate: %s%lld/%lld runs, %.0fs elapsed%s%s%s\n", final ? "done: " : "",
            (long long)done, (long long)total, elapsed, eta, final ? "" : "; now ", current);
    fflush(stderr);
}

/* Counts a finished run and shows progress. */
static void progress_line(const KvGateOptions *o, const KvRun *r) {
    account_runs(o, 1);
    if (o->progress == KV_PROGRESS_OFF || o->runs_done == NULL) return;
    ++*o->runs_done;
    char label[160], cur[320];
    kv_run_label(r, label, sizeof label); /* the variant with its planted faults, if any */
    snprintf(cur, sizeof cur, "%s %s %s", r->model, r->scenario, label);
    kv_gate_progress_print(o, cur, false);
}

/* The top k of a row without NaN in one pass: kept sorted by value, then
 * by id, which is what k rounds of "the largest untaken, the lowest id of
 * equals" pick (ids arrive in ascending order, so an equal value never
 * displaces a kept one). False, touching nothing, when the row holds a NaN:
 * the rounds' own scan then decides (a NaN wins where it is the lowest
 * untaken id, as `>` never replaces it). */
static bool topk_one_pass(const float *row /* (vocab) */, int64_t vocab, int64_t k,
                          int32_t *ids /* (k) */, float *vals /* (k) */) {
    for (int64_t v = 0; v < vocab; v++) {
        if (isnan(row[v])) return false;
    }
    int64_t n = 0;
    for (int64_t v = 0; v < vocab; v++) {
        const float x = row[v];
        if (n == k && !(x > vals[k - 1])) continue;
        int64_t at = n < k ? n++ : k - 1; /* the slot it takes, then moves up */
        while (at > 0 && x > vals[at - 1]) {
            vals[at] = vals[at - 1];
            ids[at] = ids[at - 1];
            at--;
        }
        vals[at] = x;
        ids[at] = (int32_t)v;
    }
    return true;
}

KvStatus kv_gate_keep_topk(KvRun *r, KvError *err) {
    const int64_t k = r->vocab < KV_TOPK ? r->vocab : KV_TOPK;
    const int64_t rows = r->steps * r->batch;
    r->topk_ids = malloc((size_t)(rows * k) * sizeof *r->topk_ids);
    r->topk_values = malloc((size_t)(rows * k) * sizeof *r->topk_values);
    if (r->topk_ids == NULL || r->topk_values == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "out of memory keeping top-k logits");
    }
    for (int64_t i = 0; i < rows; i++) {
        const float *row = r->logits + i * r->vocab;
        int32_t *ids = r->topk_ids + i * k;
        float *vals = r->topk_values + i * k;
        if (topk_one_pass(row, r->vocab, k, ids, vals)) continue;
        for (int64_t j = 0; j < k; j++) {
            /* j-th largest: strictly below the previous, or equal with a higher id */
            int64_t best = -1;
            for (int64_t v = 0; v < r->vocab; v++) {
                bool taken = false;
                for (int64_t q = 0; q < j && !taken; q++) taken = ids[q] == v;
                if (taken) continue;
                if (best < 0 || row[v] > row[best]) best = v;
            }
            ids[j] = (int32_t)best;
            vals[j] = row[best];
        }
    }
    free(r->logits);
    r->logits = NULL;
    r->topk = (int32_t)k;
    return KV_OK;
}

/* Whether a failed comparison of this kind keeps its runs' full logits:
 * those judged within a tolerance (what `kvrepro diff` and the plots
 * measure), and a run's own finite check (a NaN outside the top-k would
 * otherwise be gone from the report). Bitwise failures keep the row hashes,
 * which say where they differ. */
static bool kind_keeps_logits(KvCompareKind k) {
    return k == KV_CMP_REFERENCE || k == KV_CMP_COMPILED || k == KV_CMP_SHIFT ||
           k == KV_CMP_FINITE;
}

KvStatus kv_gate_trim_logits(KvReport *rep, int64_t lo, int64_t hi, const int64_t *keep,
                             int64_t n_keep, int64_t failing_max, int64_t cmp_from,
                             KvError *err) {
    if (hi <= lo) return KV_OK;
    bool *full = calloc((size_t)(hi - lo), sizeof *full); /* (hi - lo) */
    if (full == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    for (int64_t k = 0; k < n_keep; k++) {
        if (keep[k] >= lo && keep[k] < hi) full[keep[k] - lo] = true;
    }
    /* the first failing_max failing runs: enough to measure what
     * failed, and a report that stays readable when every run fails (a
     * planted fault on a 256K vocabulary) */
    int64_t failing = 0;
    for (int64_t c = cmp_from; c < rep->n_comparisons; c++) {
        const KvComparison *cmp = &rep->comparisons[c];
        if (cmp->verdict != KV_VERDICT_FAIL || !kind_keeps_logits(cmp->kind)) continue;
        const int64_t ab[2] = {cmp->run_a, cmp->run_b};
        for (int j = 0; j < 2; j++) {
            if (ab[j] < lo || ab[j] >= hi || full[ab[j] - lo]) continue;
            if (failing >= failing_max) continue;
            full[ab[j] - lo] = true;
            failing++;
        }
    }
    KvStatus st = KV_OK;
    for (int64_t i = lo; i < hi && st == KV_OK; i++) {
        if (full[i - lo] || rep->runs[i].logits == NULL) continue;
        st = kv_gate_keep_topk(&rep->runs[i], err);
    }
    free(full);
    return st;
}

static const char *const k_mode_name[2] = {"eager", "graph"};

/* Every selected variant x mode x repeat on one backend, each compared as
 * DESIGN §6 says: repeat 0 against the CPU reference (tolerance, tie-aware,
 * teacher-forced after a near-tie flip) and its replays; later repeats
 * bitwise against repeat 0; graph bitwise against eager; each variant
 * bitwise against the first one, in the same mode, on the same backend;
 * every graph-mode run against its variant's graph budget.
 *
 * Teacher forcing is decided once per (variant, backend): when a repeat 0
 * flips a token at a near-tie against the reference, it is re-run with the
 * reference's tokens, and every later run of that variant on that backend
 * (its other repeats, its graph mode) is run with them too. Bitwise
 * comparisons are then always between runs fed the same tokens: a forced
 * run against an unforced one would differ from the first forced token on,
 * a false "repeat" or "graph_vs_eager" failure. Forcing hides no real
 * difference: every run still records its greedy choice and its logits at
 * every step, and a run that flips where its bitwise twin does not already
 * differs in the logits of that step, before any forced token.
 *
 * skip: set to the backend's text when a run returns KV_SKIP (no device):
 * the run and every later run of it are then recorded as skipped. */
static KvStatus run_candidates(const KvModel *m, const char *model_name, const KvScenario *sc,
                               const KvGateOptions *o, const KvTolerances *tol,
                               const KvBackendOps *ops, int64_t ref, KvPrefillTape *tape,
                               int64_t unit_from, KvReport *rep, char *skip, size_t skip_len,
                               KvError *err) {
    KvStatus st = KV_OK;
    const int modes[2] = {o->eager ? (int)KV_MODE_EAGER : -1, o->graph ? (int)KV_MODE_GRAPH : -1};
    const char *bname = ops->name;
    CandidateTable tab = {NULL, o->repeats};
    tab.index = malloc((size_t)(o->n_variants * 2 * o->repeats) * sizeof *tab.index);
    if (tab.index == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    for (int64_t i = 0; i < (int64_t)o->n_variants * 2 * o->repeats; i++) tab.index[i] = -1;

    /* A right-padded scenario needs per-row positions: on a backend without
     * them its runs are skipped with the reason, and later scenarios still
     * run there (skip stays as it was). */
    char row_skip[256] = "";
    if (!ops->per_row && kv_decode_right_padded(sc->real, sc->batch, sc->prompt_len)) {
        snprintf(row_skip, sizeof row_skip,
                 "the %s backend does not run rows at different positions (right padding) yet",
                 bname);
    } else if (!kv_backend_can_shift(ops) && kv_scenario_shifts(sc)) {
        snprintf(row_skip, sizeof row_skip, "the %s backend does not shift a context yet", bname);
    }
    for (int v = 0; v < o->n_variants; v++) {
        bool forcing = false; /* this variant's runs on this backend feed the reference's tokens */
        for (int mi = 0; mi < 2; mi++) {
            if (modes[mi] < 0) continue;
            for (int k = 0; k < o->repeats; k++) {
                /* --first-catch: a fault pass caught in this unit makes no more runs
                 * (kv_gate_run_model counts the ones it did not make) */
                if (o->stop_at_catch && o->faults != 0 && kv_gate_failed_since(rep, unit_from)) {
                    goto cleanup;
                }
                const int64_t idx = kv_gate_add_run(rep);
                if (idx < 0) {
                    st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
                    goto cleanup;
                }
                KvRun *run = &rep->runs[idx];
                kv_run_identify(run, model_name, sc->name, o->variants[v]->name, bname,
                                k_mode_name[mi], k, o->faults);
                if (skip[0] != '\0' || row_skip[0] != '\0') {
                    /* No device (or no per-row positions): recorded as
                     * skipped, with the reason, never as passed (one entry
                     * per variant and mode). */
                    run->skipped = true;
                    snprintf(run->skip_reason, sizeof run->skip_reason, "%s",
                             skip[0] != '\0' ? skip : row_skip);
                    account_runs(o, o->repeats - k);
                    break;
                }
                st = run_decode(m, sc, o->variants[v], (KvExecMode)modes[mi], o,
                                forcing ? rep->runs[ref].tokens : NULL, ops, 0, tape, NULL, run,
                                err);
                if (st == KV_SKIP) {
                    snprintf(skip, skip_len, "%.250s", err->msg);
                    run->skipped = true;
                    snprintf(run->skip_reason, sizeof run->skip_reason, "%s", skip);
                    account_runs(o, o->repeats - k);
                    st = KV_OK;
                    break;
                }
                if (st != KV_OK) goto cleanup;
                *cand_slot(&tab, v, mi, k) = idx;
                KvComparison c;
                if (k == 0) {
                    kv_compare_reference(&rep->runs[ref], run, tol, ref, idx, &c);
                    if (ops->host) kv_compare_require_bitwise(&rep->runs[ref], run, &c);
                    if (c.near_ties > 0 && !forcing) {
                        /* A flip at a near-tie: teacher-force the reference's
                         * tokens so the later steps are still compared. */
                        KvRun forced;
                        kv_run_init(&forced);
                        kv_run_identify(&forced, model_name, sc->name, o->variants[v]->name,
                                        bname, k_mode_name[mi], k, o->faults);
                        st = run_decode(m, sc, o->variants[v], (KvExecMode)modes[mi], o,
                                        rep->runs[ref].tokens, ops, 0, tape, NULL, &forced,
                                        err);
                        if (st != KV_OK) {
                            kv_run_free(&forced);
                            goto cleanup;
                        }
                        const int64_t ties = c.near_ties;
                        kv_compare_reference(&rep->runs[ref], &forced, tol, ref, idx, &c);
                        if (ops->host) kv_compare_require_bitwise(&rep->runs[ref], &forced, &c);
                        c.near_ties = ties > c.near_ties ? ties : c.near_ties;
                        kv_run_free(&rep->runs[idx]);
                        rep->runs[idx] = forced;
                        run = &rep->runs[idx];
                        forcing = true;
                    }
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                    kv_compare_finite(run, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                    /* A decode with no step after the prefill has nothing to
                     * replay: no comparison rather than a SKIP of the run. */
                    if (o->replay_every > 0 && (run->skipped || run->steps > 1)) {
                        kv_compare_replay(run, idx, &c);
                        st = kv_gate_add_comparison(rep, &c, err);
                        if (st != KV_OK) goto cleanup;
                    }
                } else {
                    const int64_t first = *cand_slot(&tab, v, mi, 0);
                    kv_compare_bitwise(&rep->runs[first], run, KV_CMP_REPEAT, first, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                    kv_compare_finite(run, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                }
                if (k == 0 && mi == 1 && *cand_slot(&tab, v, 0, 0) >= 0) {
                    const int64_t eager = *cand_slot(&tab, v, 0, 0);
                    kv_compare_bitwise(&rep->runs[eager], run, KV_CMP_GRAPH, eager, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                }
                if (k == 0 && v > 0 && *cand_slot(&tab, 0, mi, 0) >= 0) {
                    const int64_t base = *cand_slot(&tab, 0, mi, 0);
                    kv_compare_bitwise(&rep->runs[base], run, KV_CMP_VARIANT, base, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                }
                if (modes[mi] == KV_MODE_GRAPH) {
                    kv_compare_graph_budget(run, idx, &c);
                    st = kv_gate_add_comparison(rep, &c, err);
                    if (st != KV_OK) goto cleanup;
                }
                progress_line(o, run);
            }
        }
    }
cleanup:
    free(tab.index);
    return st;
}

/* *cut: the first forward of a reference run of sc from the model's
 * stream (stream_tape.h) when a row of it is one of the stream's cuts
 * (the other rows computed alone), else left empty (the run computes its
 * own). Not with right padding (per-row positions take no tape). */
static KvStatus reference_cut(const KvGateOptions *o, const KvScenario *sc, KvPrefillTape *cut,
                              KvError *err) {
    memset(cut, 0, sizeof *cut);
    const int64_t B = sc->batch, P = sc->prompt_len, n = first_forward_columns(sc);
    if (o->stream == NULL || kv_decode_right_padded(sc->real, B, P)) return KV_OK;
    int32_t *tok = malloc((size_t)(B * n) * sizeof *tok); /* (B, n) */
    uint8_t *real = malloc((size_t)(B * n));               /* (B, n) */
    KvStatus st = KV_OK;
    if (tok == NULL || real == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    } else {
        for (int64_t b = 0; b < B; b++) {
            memcpy(tok + b * n, sc->prompt + b * P, (size_t)n * sizeof *tok);
            memcpy(real + b * n, sc->real + b * P, (size_t)n);
        }
        st = kv_stream_tape_rows(o->stream, tok, real, B, n, cut, err);
    }
    free(tok);
    free(real);
    return st;
}

KvStatus kv_gate_run_reference(const KvModel *m, const char *model_name, const KvScenario *sc,
                               const KvGateOptions *o, KvPrefillTape *tape, KvReport *rep,
                               int64_t *ref, KvComparison *fin, KvError *err) {
    *ref = kv_gate_add_run(rep);
    if (*ref < 0) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    kv_run_identify(&rep->runs[*ref], model_name, sc->name, "reference", "cpu", "eager", 0, 0);
    KvPrefillTape cut = {0};
    KvStatus st = reference_cut(o, sc, &cut, err);
    if (st != KV_OK) return st;
    st = run_decode(m, sc, NULL, KV_MODE_EAGER, o, NULL, &kv_backend_cpu, 0, tape,
                    cut.filled ? &cut : NULL, &rep->runs[*ref], err);
    kv_prefill_tape_free(&cut);
    if (st != KV_OK) return st;
    kv_compare_finite(&rep->runs[*ref], *ref, fin);
    st = kv_gate_add_comparison(rep, fin, err);
    if (st != KV_OK) return st;
    progress_line(o, &rep->runs[*ref]);
    return KV_OK;
}

KvStatus kv_gate_rows_alone(const KvModel *m, const KvRun *r, const int32_t *fed,
                            const KvStreamTape *stream, KvComparison *c, KvError *err) {
    const int64_t B = r->batch, P = r->prompt_len, S = r->steps, V = r->vocab;
    memset(c, 0, sizeof *c);
    c->kind = KV_CMP_ROW_ALONE;
    c->run_a = c->run_b = -1;
    c->first_step = c->first_row = c->first_probe = -1;
    c->verdict = KV_VERDICT_PASS;
    if (r->logits == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "rows alone: the run kept only top-k logits");
    }
    int32_t *forced = malloc((size_t)(S > 0 ? S : 1) * sizeof *forced);
    if (forced == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    KvStatus st = KV_OK;
    for (int64_t b = 0; b < B && st == KV_OK && c->verdict == KV_VERDICT_PASS; b++) {
        int64_t first = 0;
        while (first < P && !r->prompt_real[b * P + first]) first++;
        for (int64_t s = 0; s < S; s++) forced[s] = fed[s * B + b];
        /* a row that is a cut of the stream takes it, as its batch did:
         * the check is then on the decode steps (rows beside it, pads in
         * its own positions) */
        KvPrefillTape cut = {0};
        if (kv_stream_tape_fits(stream, r->prompt + b * P + first, P - first)) {
            st = kv_stream_tape_cut(stream, P - first, &cut, err);
            if (st != KV_OK) break;
        }
        const KvDecodeSpec one = {
            .batch = 1,
            .prompt_len = P - first,
            .prompt = r->prompt + b * P + first,
            .prompt_real = r->prompt_real + b * P + first,
            .new_tokens = S,
            .forced = forced,
            .tape_play = cut.filled ? &cut : NULL,
        };
        KvDecodeResult alone;
        st = kv_decode_greedy(m, &one, &alone, err);
        kv_prefill_tape_free(&cut);
        if (st != KV_OK) break;
        for (int64_t s = 0; s < S && c->first_step < 0; s++) {
            if (memcmp(alone.logits + s * V, r->logits + (s * B + b) * V,
                       (size_t)V * sizeof(float)) != 0) {
                c->verdict = KV_VERDICT_FAIL;
                c->first_step = s;
                c->first_row = b;
            }
        }
        kv_decode_result_free(&alone);
    }
    free(forced);
    if (c->verdict == KV_VERDICT_PASS) {
        snprintf(c->message, sizeof c->message, "each of the %lld rows of the left-padded batch "
                 "is bitwise the same prompt decoded alone", (long long)B);
    } else {
        snprintf(c->message, sizeof c->message, "row %lld of the left-padded batch differs from "
                 "the same prompt decoded alone, fed the same tokens, at step %lld: padding must "
                 "only shift slots (does the reference count pads in positions?)",
                 (long long)c->first_row, (long long)c->first_step);
    }
    return st;
}

/* Whether a scenario's reference run gets the rows-alone check: a batch
 * of left-padded rows of different lengths, decoded without a script
 * (prefix reuse and a shift change a row's context mid-decode) and without
 * per-row positions (right padding has its own row-alone tests). */
static bool rows_alone_applies(const KvScenario *sc) {
    if (sc->batch < 2 || kv_scenario_switches(sc) || kv_scenario_shifts(sc) ||
        kv_decode_right_padded(sc->real, sc->batch, sc->prompt_len)) {
        return false;
    }
    for (int64_t i = 0; i < sc->batch * sc->prompt_len; i++) {
        if (!sc->real[i]) return true;
    }
    return false;
}

/* Appends a tolerance entry to the report (the calibrated value a unit
 * used, and why). */
KvStatus kv_gate_add_tolerance(KvReport *rep, const char *name, double value, const char *reason,
                               KvError *err) {
    KvTolerance *ts = realloc(rep->tolerances, (size_t)(rep->n_tolerances + 1) * sizeof *ts);
    if (ts == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    rep->tolerances = ts;
    KvTolerance *t = &ts[rep->n_tolerances++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->value = value;
    snprintf(t->reason, sizeof t->reason, "%s", reason);
    return KV_OK;
}

KvStatus kv_gate_record_tolerances(const KvGateOptions *o, KvReport *rep, KvError *err) {
    KvStatus st = kv_tolerances_record(&o->tol, rep, err);
    if (st != KV_OK) return st;
    char *reason = rep->tolerances[0].reason; /* max_rel_err (kv_tolerances_record) */
    const size_t n = sizeof rep->tolerances[0].reason;
    if (o->tol_max_rel_err_set) {
        snprintf(reason, n, "set by --tol: overrides calibration in every unit");
    } else if (o->calibrate) {
        snprintf(reason, n, "not used: each (model, scenario) is judged by its calibrated "
                 "max_rel_err@MODEL/SCENARIO (--no-calibrate uses this)");
    }
    return KV_OK;
}

/* The reference judged against its fp64 shadow (KV_CMP_SHADOW, a = b =
 * ref): fails above KV_FP64_MAX_REL_ERR, naming the first step beyond it;
 * a NaN error (a non-finite reference) fails too. */
static KvStatus shadow_judge(const KvRun *r, int64_t ref, double fp64, int64_t steps,
                             KvReport *rep, KvError *err) {
    KvComparison c;
    memset(&c, 0, sizeof c);
    c.kind = KV_CMP_SHADOW;
    c.run_a = c.run_b = ref;
    c.first_step = c.first_row = c.first_probe = -1;
    c.max_rel_err = fp64;
    if (fp64 <= KV_FP64_MAX_REL_ERR) {
        c.verdict = KV_VERDICT_PASS;
        snprintf(c.message, sizeof c.message, "the reference is within %.3g of its fp64 shadow "
                 "over %lld steps (bound %g)", fp64, (long long)steps, KV_FP64_MAX_REL_ERR);
        return kv_gate_add_comparison(rep, &c, err);
    }
    c.verdict = KV_VERDICT_FAIL;
    for (int64_t s = 0; s < steps && c.first_step < 0; s++) {
        if (!(r->fp64_rel_err[s] <= KV_FP64_MAX_REL_ERR)) c.first_step = s;
    }
    snprintf(c.message, sizeof c.message, "the reference disagrees with its fp64 shadow: max "
             "rel err %.3g > %g, first at step %lld (a bug in the reference moves every run "
             "alike; no tolerance that passes it is honest)", fp64, KV_FP64_MAX_REL_ERR,
             (long long)c.first_step);
    return kv_gate_add_comparison(rep, &c, err);
}

/* The fp64 shadow's progress (KvShadowProgress): its row and layer, and
 * its share of its estimated seconds so far. */
typedef struct {
    const KvGateOptions *o;
    const char *model, *scenario;
    int64_t batch, layers;
    double est;
} ShadowWatch;

static void shadow_progress(void *ctx, int64_t row, int64_t layer) {
    const ShadowWatch *w = ctx;
    if (w->o->est_running != NULL) {
        *w->o->est_running =
            w->est * (double)(row * w->layers + layer + 1) / (double)(w->batch * w->layers);
    }
    char cur[320];
    snprintf(cur, sizeof cur, "%s %s fp64 shadow (row %lld of %lld, layer %lld of %lld)",
             w->model, w->scenario, (long long)row + 1, (long long)w->batch, (long long)layer + 1,
             (long long)w->layers);
    kv_gate_progress_print(w->o, cur, false);
}

KvStatus kv_gate_calibrate(const KvModel *m, const char *model_name, const KvScenario *sc,
                           const KvGateOptions *o, int64_t ref, bool ref_finite, KvReport *rep,
                           KvTolerances *tol, KvError *err) {
    KvStatus st = KV_OK;
    *tol = o->tol;
    if (!o->calibrate) return KV_OK;
    if (!ref_finite) {
        /* not run, for the reason the reference's failed finite check states */
        account_runs(o, KV_ENSEMBLE_SIZE);
        return KV_OK;
    }
    bool needed = true;
    st = kv_gate_members_needed(&m->config, o, &needed, err);
    if (st != KV_OK) return st;
    int64_t members[KV_ENSEMBLE_SIZE];
    double spread = 0.0, each[KV_ENSEMBLE_SIZE] = {0.0};
    if (!needed) {
        /* not run, for the reason the max_rel_err row states */
        account_runs(o, KV_ENSEMBLE_SIZE);
        if (o->runs_done != NULL) *o->runs_done += KV_ENSEMBLE_SIZE;
    }
    for (int i = 0; needed && i < KV_ENSEMBLE_SIZE; i++) {
        const unsigned order = kv_ensemble_member(i);
        char name[KV_NAME_LEN], oname[48];
        kv_order_name(order, oname, sizeof oname);
        snprintf(name, sizeof name, "reference~%s", oname);
        members[i] = kv_gate_add_run(rep);
        if (members[i] < 0) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        kv_run_identify(&rep->runs[members[i]], model_name, sc->name, name, "cpu", "eager", 0, 0);
        st = run_decode(m, sc, NULL, KV_MODE_EAGER, o, NULL, &kv_backend_cpu, order, NULL,
                        NULL, &rep->runs[members[i]], err);
        if (st != KV_OK) return st;
        KvComparison c;
        kv_compare_reference(&rep->runs[ref], &rep->runs[members[i]], &o->tol, ref, members[i],
                             &c);
        each[i] = c.max_rel_err;
        if (c.max_rel_err > spread) spread = c.max_rel_err; /* NaN never wins */
        progress_line(o, &rep->runs[members[i]]);
    }
    /* The yardstick: the reference's own error against its fp64 shadow,
     * recorded per step on the reference run. */
    KvRun *r = &rep->runs[ref];
    double fp64 = 0.0;
    free(r->fp64_rel_err);
    r->fp64_rel_err = malloc((size_t)(r->steps > 0 ? r->steps : 1) * sizeof *r->fp64_rel_err);
    if (r->fp64_rel_err == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    /* The shadow decodes one request: a prefix-reuse run's steps up to its
     * switch (the second request's are the fresh twin's, judged bitwise). */
    const int64_t shadow_steps = kv_scenario_switches(sc) ? sc->switch_step
                                 : kv_scenario_shifts(sc) ? sc->shift_step
                                                          : r->steps;
    for (int64_t i = shadow_steps; i < r->steps; i++) r->fp64_rel_err[i] = 0.0;
    /* minutes at real scale: a progress line per layer. Its estimate: in
     * doubles summed one at a time, about twice a sequential-order member
     * over the rows' real tokens (kv_gate_work_add counts it so). */
    ShadowWatch watch = {o, r->model, r->scenario, r->batch, m->config.num_layers, 0.0};
    if (o->rate != NULL) {
        int64_t real_positions = 0; /* the shadow decodes each row alone */
        for (int64_t j = 0; j < r->batch * r->prompt_len; j++) real_positions += r->prompt_real[j];
        watch.est = 2.0 * kv_rate_decode_seconds(&m->config, o->rate, real_positions, r->steps - 1,
                                                 r->batch, run_keys(&m->config, sc), true);
    }
    const KvShadowProgress progress = {shadow_progress, &watch};
    st = kv_shadow64_rel_error_watched(m, r->batch, r->prompt_len, r->prompt, r->prompt_real,
                                       shadow_steps, r->tokens, r->logits, r->fp64_rel_err, &fp64,
                                       &progress, err);
    if (o->est_running != NULL) *o->est_running = 0.0;
    if (st != KV_OK) return st;
    if (o->est_done != NULL) *o->est_done += watch.est;
    st = shadow_judge(r, ref, fp64, shadow_steps, rep, err);
    if (st != KV_OK) return st;
    const double cal = kv_cal_tolerance(spread, fp64);
    char reason[160], tname[KV_NAME_LEN];
    if (needed) {
        snprintf(tname, sizeof tname, "spread@%.23s/%.27s", model_name, sc->name);
        snprintf(reason, sizeof reason, "max rel logit err of the reference under %d other "
                 "orders: keys_reversed %.3g, dot_sequential %.3g, both %.3g", KV_ENSEMBLE_SIZE,
                 each[0], each[1], each[2]);
        st = kv_gate_add_tolerance(rep, tname, spread, reason, err);
        if (st != KV_OK) return st;
    }
    snprintf(tname, sizeof tname, "fp64_err@%.23s/%.27s", model_name, sc->name);
    st = kv_gate_add_tolerance(rep, tname, fp64,
                       "max rel logit err of the reference against its fp64 shadow (shadow64.h)",
                       err);
    if (st != KV_OK) return st;
    if (!needed) {
        /* the reason row holds 159 characters */
        snprintf(reason, sizeof reason, "not calibrated: no tolerance decides here (CPU runs "
                 "only, held bitwise; no judged context shift), so the %d order members were "
                 "not run", KV_ENSEMBLE_SIZE);
    } else if (o->tol_max_rel_err_set) {
        snprintf(reason, sizeof reason, "set by --tol (calibration would give %.3g)", cal);
    } else {
        tol->max_rel_err = cal;
        snprintf(reason, sizeof reason, "calibrated: max(%d x spread, %d x fp64_err, %g)",
                 KV_CAL_SPREAD_MULT, KV_CAL_FP64_MULT, KV_CAL_FLOOR);
    }
    snprintf(tname, sizeof tname, "max_rel_err@%.23s/%.27s", model_name, sc->name);
    st = kv_gate_add_tolerance(rep, tname, tol->max_rel_err, reason, err);
    for (int i = 0; st == KV_OK && needed && i < KV_ENSEMBLE_SIZE; i++) {
        KvComparison c;
        kv_compare_reference(&rep->runs[ref], &rep->runs[members[i]], tol, ref, members[i], &c);
        st = kv_gate_add_comparison(rep, &c, err);
        if (st != KV_OK) break;
        kv_compare_finite(&rep->runs[members[i]], members[i], &c);
        st = kv_gate_add_comparison(rep, &c, err);
    }
    return st;
}

/* The fresh twin of a prefix-reuse scenario (kv_scenario_fresh): the
 * second request run from scratch on the CPU reference, its own run (with
 * its finite check), and the reused reference run compared with it bitwise
 * (KV_CMP_FRESH). Candidates are held to the reference, so this is what
 * makes "the reused state equals a fresh run's" hold for every run. */
/* A fresh twin run (forced: (steps, B) or NULL) decoded on the CPU
 * reference as run *idx of rep, with its finite check. */
KvStatus kv_gate_run_forced_reference(const KvModel *m, const char *model_name,
                                      const KvScenario *fresh, const KvGateOptions *o,
                                      const int32_t *forced, KvReport *rep, int64_t *idx,
                                      KvError *err) {
    *idx = kv_gate_add_run(rep);
    if (*idx < 0) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    kv_run_identify(&rep->runs[*idx], model_name, fresh->name, "reference", "cpu", "eager", 0, 0);
    /* a fresh context that is a prefix of the stream (the speculative
     * rollback's: the prompt and the accepted drafts) is that one forward */
    KvPrefillTape cut = {0};
    KvStatus st = reference_cut(o, fresh, &cut, err);
    if (st != KV_OK) return st;
    st = run_decode(m, fresh, NULL, KV_MODE_EAGER, o, forced, &kv_backend_cpu, 0, NULL,
                    cut.filled ? &cut : NULL, &rep->runs[*idx], err);
    kv_prefill_tape_free(&cut);
    if (st != KV_OK) return st;
    KvComparison c;
    kv_compare_finite(&rep->runs[*idx], *idx, &c);
    return kv_gate_add_comparison(rep, &c, err);
}

static KvStatus run_fresh_twin(const KvModel *m, const char *model_name, const KvScenario *sc,
                               const KvGateOptions *o, int64_t ref, KvReport *rep,
                               KvError *err) {
    KvScenario fresh;
    KvStatus st = kv_scenario_fresh(sc, &fresh, err);
    if (st != KV_OK) return st;
    int64_t idx = -1;
    st = kv_gate_run_forced_reference(m, model_name, &fresh, o, NULL, rep, &idx, err);
    if (st != KV_OK) goto cleanup;
    KvComparison c;
    kv_compare_fresh(&rep->runs[ref], &rep->runs[idx], sc->switch_step, ref, idx, &c);
    st = kv_gate_add_comparison(rep, &c, err);
    /* not counted in the progress total (units x runs per unit): the twin
     * is a fraction of one reference decode */
cleanup:
    kv_scenario_free(&fresh);
    return st;
}

/* The fresh twin of a context-shift scenario (kv_scenario_shift_fresh):
 * the shifted context run from scratch on the CPU reference, teacher-forced
 * with the reference's later tokens, its finite check, and the shifted
 * reference run compared with it within the shift's tolerance
 * (KV_CMP_SHIFT; candidates are held to the shifted reference bitwise). On
 * a model with a full-attention layer the comparison is recorded as
 * skipped with the reason (kv_scenario_shift_judged) and nothing runs. */
static KvStatus run_shift_twin(const KvModel *m, const char *model_name, const KvScenario *sc,
                               const KvGateOptions *o, const KvTolerances *tol, int64_t ref,
                               KvReport *rep, KvError *err) {
    KvComparison c;
    char why[256];
    if (!kv_scenario_shift_judged(&m->config, why, sizeof why)) {
        memset(&c, 0, sizeof c);
        c.kind = KV_CMP_SHIFT;
        c.run_a = c.run_b = ref;
        c.first_step = c.first_row = c.first_probe = -1;
        c.verdict = KV_VERDICT_SKIP;
        snprintf(c.message, sizeof c.message, "%s", why);
        return kv_gate_add_comparison(rep, &c, err);
    }
    KvScenario fresh;
    int32_t *forced = NULL;
    KvStatus st = kv_scenario_shift_fresh(sc, rep->runs[ref].tokens, &fresh, &forced, err);
    if (st != KV_OK) return st;
    int64_t idx = -1;
    st = kv_gate_run_forced_reference(m, model_name, &fresh, o, forced, rep, &idx, err);
    if (st != KV_OK) goto cleanup;
    /* The scenario's own tolerance: the shifted run re-rotates stored keys
     * (RoPE(p), then RoPE(-d)) where the fresh run rotates once (RoPE(p -
     * d)), an fp32 rounding of the angle and the rotation of the kind the
     * fp64 error measures, so |shifted - fresh| <= |shifted - exact| +
     * |fresh - exact| is about twice it; the calibrated max_rel_err allows 8
     * x (DESIGN §6). Measured on the tiny fixtures: 6.7e-7 and 8.9e-7
     * against a calibrated 2e-5; a shift without re-rotation moves logits
     * by 0.1 or more. */
    kv_compare_shifted(&rep->runs[ref], &rep->runs[idx], sc->shift_step, tol, ref, idx, &c);
    st = kv_gate_add_comparison(rep, &c, err);
cleanup:
    free(forced);
    kv_scenario_free(&fresh);
    return st;
}

/* Runs one (model, scenario) unit. model_tol NULL: the unit calibrates
 * itself; else it is judged by the model's calibration, made on another
 * unit (*model_tol, model_cal its scenario: kv_gate_run_model). *tol_out
 * (may be NULL) receives the tolerances the unit judged by. */
static KvStatus run_scenario(const KvModel *m, const char *model_name, const KvScenario *sc,
                             const KvGateOptions *o, const KvTolerances *model_tol,
                             const char *model_cal, KvTolerances *tol_out, KvReport *rep,
                             KvError *err) {
    const int64_t cmp_from = rep->n_comparisons;
    int64_t ref = -1;
    KvComparison fin;
    /* the reference's first prefill forward, taken by every CPU variant run
     * of this scenario (prefill_tape.h) unless --no-shared-prefill */
    KvPrefillTape tape = {0};
    KvPrefillTape *share = o->share_prefill ? &tape : NULL;
    KvStatus st = kv_gate_run_reference(m, model_name, sc, o, share, rep, &ref, &fin, err);
    if (st != KV_OK) goto cleanup;
    if (kv_scenario_switches(sc)) {
        st = run_fresh_twin(m, model_name, sc, o, ref, rep, err);
        if (st != KV_OK) goto cleanup;
    }
    /* RoPE sees only relative positions, so a reference that counts pads
     * in them agrees with its fp64 shadow and with every candidate: only
     * the rows decoded alone see it (the reference judged too, DESIGN §6) */
    if (fin.verdict != KV_VERDICT_FAIL && rows_alone_applies(sc)) {
        KvComparison c;
        st = kv_gate_rows_alone(m, &rep->runs[ref], rep->runs[ref].tokens, o->stream, &c, err);
        if (st != KV_OK) goto cleanup;
        c.run_a = c.run_b = ref;
        st = kv_gate_add_comparison(rep, &c, err);
        if (st != KV_OK) goto cleanup;
    }
    KvTolerances tol;
    if (model_tol == NULL) {
        st = kv_gate_calibrate(m, model_name, sc, o, ref, fin.verdict != KV_VERDICT_FAIL, rep,
                               &tol, err);
    } else {
        tol = *model_tol;
        /* the members planned for this unit are accounted for by the
         * tolerance row's stated reason, as when a reference is not finite */
        account_runs(o, KV_ENSEMBLE_SIZE);
        if (o->runs_done != NULL) *o->runs_done += KV_ENSEMBLE_SIZE;
        char tname[KV_NAME_LEN], reason[160];
        snprintf(tname, sizeof tname, "max_rel_err@%.23s/%.27s", model_name, sc->name);
        bool needed = true;
        st = kv_gate_members_needed(&m->config, o, &needed, err);
        if (st != KV_OK) goto cleanup;
        snprintf(reason, sizeof reason, "the model's calibration, made once on %.60s (%s)",
                 model_cal, needed ? "the real-scale set calibrates per model"
                                   : "not calibrated: no tolerance decides here");
        st = kv_gate_add_tolerance(rep, tname, tol.max_rel_err, reason, err);
    }
    if (st != KV_OK) goto cleanup;
    if (tol_out != NULL) *tol_out = tol;
    if (kv_scenario_shifts(sc) && fin.verdict != KV_VERDICT_FAIL) {
        st = run_shift_twin(m, model_name, sc, o, &tol, ref, rep, err);
        if (st != KV_OK) goto cleanup;
    }

    /* A reference that is not finite has nothing to judge candidates by:
     * its own check fails the gate, and the candidates of this scenario are
     * recorded as skipped with that reason instead of failing by the
     * hundred on the same NaN. */
    char ref_skip[256] = "";
    if (fin.verdict == KV_VERDICT_FAIL) {
        snprintf(ref_skip, sizeof ref_skip, "not run: the reference is not finite (step %lld, "
                 "probe %s)", (long long)fin.first_step,
                 fin.first_probe >= 0 ? rep->runs[ref].probe_names[fin.first_probe] : "logits");
    }
    for (int i = 0; i < o->n_backends; i++) {
        KvGateBackend *gb = &o->backends[i];
        char local[256];
        char *skip = gb->skip;
        size_t skip_len = sizeof gb->skip;
        if (ref_skip[0] != '\0' && gb->skip[0] == '\0') {
            /* Only this scenario's runs are skipped, not the backend's. */
            snprintf(local, sizeof local, "%s", ref_skip);
            skip = local;
            skip_len = sizeof local;
        }
        st = run_candidates(m, model_name, sc, o, &tol, gb->ops, ref, share, cmp_from, rep, skip,
                            skip_len, err);
        if (st != KV_OK) goto cleanup;
    }

    /* Every comparison of this scenario was made on the full rows in
     * memory. Large vocabularies now keep only the top-k logits of the runs
     * that passed (the report would otherwise be huge), and so do
     * planted-fault passes: their logits differ run to run, so nothing
     * hard-links, and `--faults all` would store ~13x the clean logits. The
     * reference and both runs of every failed tolerance comparison keep
     * their full rows: what `kvrepro diff` and the plots measure. A
     * mutation run's planted-fault pass over a large vocabulary keeps none: its reference
     * is the clean pass's bit for bit, its failures are counted by the score
     * rather than measured, and a real model's rows (16 MiB a step at 256K
     * logits and 4 rows) for every caught unit would not fit in memory. */
    const bool big = m->config.vocab_size > o->full_logits_max_vocab;
    if (big || o->faults != 0) {
        const bool none = big && o->faults != 0 && o->mutation;
        st = kv_gate_trim_logits(rep, ref, rep->n_runs, &ref, none ? 0 : 1,
                                 none ? 0 : KV_FAILING_FULL_MAX, cmp_from, err);
    }
cleanup:
    kv_prefill_tape_free(&tape);
    return st;
}

/* sum over t = 1..T of min(t, W) (W <= 0: no window): the keys the queries
 * of a T-token decode attend to on one layer. */
static double keys_attended(int64_t T, int64_t W) {
    const double t = (double)T;
    if (W <= 0 || T <= W) return t * (t + 1.0) / 2.0;
    const double w = (double)W;
    return w * (w + 1.0) / 2.0 + (t - w) * w;
}

/* The columns of sc's first prefill forward (what a shared prefill gives
 * every CPU variant run), 0 when none is shared: right padding (per-row
 * positions) or --no-shared-prefill. */
static int64_t work_shared_columns(const KvScenario *sc, const KvGateOptions *o) {
    if (!o->share_prefill || kv_decode_right_padded(sc->real, sc->batch, sc->prompt_len) ||
        (o->faults & KV_FAULTS_IN_FORWARD) != 0) {
        return 0;
    }
    return first_forward_columns(sc);
}

/* Adds sc's first forward to the stream's cuts (ascending, distinct, at
 * most KV_PROBE_CUT_MAX) when its first row's is a prefix of the real-scale
 * stream (left padding, every column real); *fits counts such runs. */
static KvStatus cut_add(const KvConfig *cfg, const KvGateOptions *o, const KvScenario *sc,
                        int64_t *cut, int64_t *n_cut, int64_t *fits, KvError *err) {
    const int64_t n = first_forward_columns(sc);
    /* the first row (a batch's longest, unpadded, when it is one) */
    bool prefix = !kv_decode_right_padded(sc->real, sc->batch, sc->prompt_len);
    for (int64_t t = 0; prefix && t < n; t++) prefix = sc->real[t] != 0;
    if (!prefix) return KV_OK;
    int32_t *stream = malloc((size_t)n * sizeof *stream); /* (n) */
    if (stream == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    kv_scenario_stream(cfg, o->prompt_seed, n, stream);
    prefix = memcmp(stream, sc->prompt, (size_t)n * sizeof *stream) == 0;
    free(stream);
    if (!prefix) return KV_OK;
    ++*fits;
    int64_t at = 0;
    while (at < *n_cut && cut[at] < n) at++;
    if ((at < *n_cut && cut[at] == n) || *n_cut == KV_PROBE_CUT_MAX) return KV_OK;
    memmove(cut + at + 1, cut + at, (size_t)(*n_cut - at) * sizeof *cut);
    cut[at] = n;
    ++*n_cut;
    return KV_OK;
}

/* The cuts of a model's stream (stream_tape.h): the first forwards of the
 * reference runs (a unit's reference, a switch's fresh twin) of
 * this shard's units from *unit on that are prefixes of the real-scale
 * stream; none unless at least two share it (one would only move its
 * forward). Real scale, shared prefill, the built-in scenarios. */
static KvStatus gate_stream_cuts(const KvConfig *cfg, const KvGateOptions *o, int unit,
                                 int64_t *cut, int64_t *n_cut, KvError *err) {
    *n_cut = 0;
    if (!o->share_prefill || o->custom != NULL || kv_scenario_scale(cfg) != KV_SCALE_REAL) {
        return KV_OK;
    }
    int64_t fits = 0;
    for (int i = 0; i < o->n_scenarios; i++) {
        if (!kv_gate_unit_in_shard(o, unit + i)) continue;
        KvScenario sc, fresh = {0};
        KvStatus st = kv_scenario_build(cfg, o->scenarios[i], o->prompt_seed, &sc, err);
        if (st != KV_OK) return st;
        st = cut_add(cfg, o, &sc, cut, n_cut, &fits, err);
        if (st == KV_OK && kv_scenario_switches(&sc)) {
            st = kv_scenario_fresh(&sc, &fresh, err);
            if (st == KV_OK) st = cut_add(cfg, o, &fresh, cut, n_cut, &fits, err);
            kv_scenario_free(&fresh);
        }
        kv_scenario_free(&sc);
        if (st != KV_OK) return st;
    }
    if (fits < 2) *n_cut = 0;
    return KV_OK;
}

static int gate_calibration_unit_of(const KvConfig *cfg, const KvGateOptions *o, KvError *err,
                                    KvStatus *st);

/* Bytes a unit of sc holds beside the weights while one of its runs
 * decodes (an estimate from what state.c, cpu_state.c and prefill_tape.h
 * allocate; the heap's own overhead is not counted): the run's state (the static cache of every layer over every
 * position, a forward's activations over its widest chunk, the attention's
 * scratch per thread), the variant's own cache beside it (at most as
 * large), the reference's prefill tape kept for the unit's variants, and
 * the fp64 shadow's state in doubles when the unit calibrates. */
static double unit_bytes(const KvConfig *cfg, const KvScenario *sc, int64_t steps,
                         bool calibrates) {
    const double B = (double)sc->batch, L = (double)cfg->num_layers;
    const double kvd = (double)(cfg->num_kv_heads * cfg->head_dim);
    const double qd = (double)(cfg->num_heads * cfg->head_dim);
    const double H = (double)cfg->hidden_size, I = (double)cfg->intermediate_size;
    const int64_t chunk = sc->prefill_chunk > 0 && sc->prefill_chunk < sc->prompt_len
                              ? sc->prefill_chunk
                              : sc->prompt_len;
    const int64_t longest = chunk > sc->suffix_len ? chunk : sc->suffix_len;
    const double len = (double)(sc->prompt_len + steps + sc->suffix_len);
    const double rows = B * (double)longest;
    const double cache = 2.0 * L * B * len * kvd * 4.0;
    /* x, xn, tmp, q, att, the new k and v, the MLP's gate and up (an MoE's
     * experts add their own: counted as twice the MLP) */
    const double mlp = cfg->num_experts > 0 ? 4.0 * I : 2.0 * I;
    const double act = rows * (3.0 * H + 2.0 * qd + 2.0 * kvd + mlp) * 4.0;
    const double scratch = 64.0 * (len + (double)cfg->sliding_window) * 28.0;
    const double logits = B * (double)cfg->vocab_size * 4.0;
    const double state = cache + act + scratch + logits;
    const double tape = 2.0 * L * B * (double)chunk * kvd * 4.0;
    const double run = state + cache + tape;
    /* the shadow runs one row at a time, one layer at a time, over all
     * of its positions, in doubles */
    const double shadow =
        calibrates ? len * (3.0 * H + 2.0 * qd + 2.0 * kvd + mlp) * 8.0 : 0.0;
    return run > shadow + tape ? run : shadow + tape;
}

KvStatus kv_gate_work_add(const KvConfig *cfg, const KvGateOptions *o, const KvRate *rate,
                          int *unit, KvGateWork *w, KvError *err) {
    const double H = (double)cfg->hidden_size;
    const double qd = (double)(cfg->num_heads * cfg->head_dim);
    /* multiply-adds per token per layer (a MoE runs experts_per_tok experts) */
    const double layer_mac =
        kv_rate_layer_weights(cfg, cfg->num_experts > 0 ? (double)cfg->experts_per_tok : 1.0);
    const int64_t cands = gate_candidate_runs(o, true); /* CPU candidate runs per unit */
    const int n = o->custom != NULL ? 1 : o->n_scenarios;
    KvStatus cst = KV_OK;
    const int cal = kv_gate_calibrates_per_model(cfg, o) ? gate_calibration_unit_of(cfg, o, err,
                                                                                     &cst)
                                                         : -1;
    if (cst != KV_OK) return cst;
    bool needed = true; /* the calibration's members */
    cst = kv_gate_members_needed(cfg, o, &needed, err);
    if (cst != KV_OK) return cst;
    /* the references' first rows, one shared prefill (stream_tape.h) */
    int64_t cut[KV_PROBE_CUT_MAX], n_cut = 0;
    cst = gate_stream_cuts(cfg, o, *unit, cut, &n_cut, err);
    if (cst != KV_OK) return cst;
    if (n_cut > 0) {
        const int64_t sn = cut[n_cut - 1];
        const double kvd = (double)(cfg->num_kv_heads * cfg->head_dim);
        const double keys = prefill_keys(cfg, sn);
        w->streams += 1;
        w->decodes += 1;
        w->tokens += sn;
        w->flop += 2.0 * layer_mac * (double)cfg->num_layers * (double)sn +
                   2.0 * H * (double)cfg->vocab_size + 4.0 * qd * keys;
        if (rate != NULL) w->seconds += kv_rate_decode_seconds(cfg, rate, sn, 0, 1, keys, false);
        /* held through every unit: its keys and values; while it runs, a
         * one-row state over all of it besides (unit_bytes' reckoning) */
        w->stream_bytes = 2.0 * (double)cfg->num_layers * (double)sn * kvd * 4.0;
        const double mlp = cfg->num_experts > 0 ? 4.0 : 2.0;
        const double rec = w->stream_bytes +
                           (double)sn * (3.0 * H + 2.0 * qd + 2.0 * kvd +
                                         mlp * (double)cfg->intermediate_size) * 4.0;
        if (rec > w->unit_bytes) {
            w->unit_bytes = rec;
            snprintf(w->unit_name, sizeof w->unit_name, "the shared prefill stream: 1 row, %lld "
                     "tokens", (long long)sn);
        }
    }
    for (int i = 0; i < n; i++, (*unit)++) {
        if (!kv_gate_unit_in_shard(o, *unit)) continue;
        KvScenario sc = {0};
        const KvScenario *use = o->custom;
        if (use == NULL) {
            KvStatus st = kv_scenario_build(cfg, o->scenarios[i], o->prompt_seed, &sc, err);
            if (st != KV_OK) return st;
            if (o->max_new_tokens > 0 && sc.new_tokens > o->max_new_tokens) {
                sc.new_tokens = o->max_new_tokens;
            }
            use = &sc;
        }
        KvStatus lst = kv_limits_check_scenario(use->batch, use->prompt_len, use->new_tokens,
                                                use->name, err);
        if (lst != KV_OK) {
            kv_scenario_free(&sc);
            return lst;
        }
        const bool calibrates = o->calibrate && (cal < 0 || cal == i);
        w->runs += kv_gate_runs_planned_per_unit(o);
        if (use->new_tokens > w->max_steps) w->max_steps = use->new_tokens;
        if (use->batch > w->max_batch) w->max_batch = use->batch;
        if (use->prompt_len > w->max_prompt_len) w->max_prompt_len = use->prompt_len;
        const int64_t B = use->batch, P = use->prompt_len, S = use->new_tokens;
        const int64_t T = P + S - 1; /* positions fed */
        const int64_t steps = S - 1;  /* one-token forwards after the prefill */
        const int64_t replays =
            o->replay_every > 0 && S > 1
                ? 2 * ((S - 1) / o->replay_every > 0 ? (S - 1) / o->replay_every : 1)
                : 0;
        const double keys = run_keys_steps(cfg, use, S, 0); /* over the rows */
        /* per row: matmuls over every position, the lm_head once per forward
         * (decode steps + prefill); per run: QK and PV over the keys each
         * query sees */
        const double row_flop = 2.0 * layer_mac * (double)cfg->num_layers * (double)T +
                                2.0 * H * (double)cfg->vocab_size * (double)S;
        const double run_flop = (double)B * row_flop + 4.0 * qd * keys;
        const double per_pos = run_flop / (double)(B * (T > 0 ? T : 1));
        const int64_t shared = work_shared_columns(use, o);
        /* the reference, its fresh twin (a scripted unit's, about one more
         * reference), the calibration's members and fp64 shadow, and each
         * CPU candidate with its replayed steps, without the shared columns */
        char why[256];
        const bool twin =
            kv_scenario_switches(use) ||
            (kv_scenario_shifts(use) && kv_scenario_shift_judged(cfg, why, sizeof why));
        const int64_t members = calibrates && needed ? KV_ENSEMBLE_SIZE : 0;
        /* the shadow decodes each row alone, on its real tokens */
        int64_t real_positions = 0;
        for (int64_t j = 0; j < use->batch * use->prompt_len; j++) real_positions += use->real[j];
        const double ub = unit_bytes(cfg, use, use->new_tokens, calibrates);
        /* what the report keeps until it is written: the reference's and
         * the fresh twin's full logits, every other CPU run's top-k (ids
         * and values); a failing run keeps its full logits too */
        const double per_run = (double)(use->batch * use->new_tokens);
        const double topk = (double)(cfg->vocab_size < KV_TOPK ? cfg->vocab_size : KV_TOPK);
        w->report_bytes += per_run * ((double)(1 + (twin ? 1 : 0)) * (double)cfg->vocab_size * 4.0 +
                                      (double)cands * topk * 8.0);
        if (ub > w->unit_bytes) {
            w->unit_bytes = ub;
            snprintf(w->unit_name, sizeof w->unit_name, "%s: batch %lld, prompt %lld, %lld new",
                     use->name, (long long)use->batch, (long long)use->prompt_len,
                     (long long)use->new_tokens);
        }
        const int64_t cand_tokens = B * (T - shared + replays);
        /* a reference whose first row's first forward is cut from the stream,
         * and a fresh twin whose whole context is a cut */
        int64_t cut_cols = 0, twin_cut = 0;
        for (int64_t j = 0; j < n_cut && !kv_decode_right_padded(use->real, B, P); j++) {
            if (cut[j] == first_forward_columns(use)) cut_cols = cut[j];
        }
        if (n_cut > 0 && kv_scenario_switches(use)) {
            KvScenario fresh;
            KvStatus st = kv_scenario_fresh(use, &fresh, err);
            if (st != KV_OK) {
                kv_scenario_free(&sc);
                return st;
            }
            for (int64_t j = 0; fresh.batch == 1 && j < n_cut; j++) {
                if (cut[j] == first_forward_columns(&fresh)) twin_cut = cut[j];
            }
            kv_scenario_free(&fresh);
        }
        w->references += 1;
        w->twins += twin ? 1 : 0;
        w->members += members;
        w->shadows += calibrates ? 1 : 0;
        w->candidates += cands;
        w->decodes += 1 + (twin ? 1 : 0) + members + (calibrates ? 1 : 0) + cands;
        const int64_t shadow_tokens = calibrates ? real_positions + B * steps : 0;
        w->tokens += B * T * (1 + (twin ? 1 : 0) + members) - cut_cols - twin_cut +
                     shadow_tokens + cands * cand_tokens;
        w->flop += run_flop * (double)(1 + (twin ? 1 : 0) + members) -
                   per_pos * (double)(cut_cols + twin_cut) + per_pos * (double)shadow_tokens +
                   (double)cands * per_pos * (double)cand_tokens;
        if (rate != NULL) {
            const double ref_s = kv_rate_decode_seconds(cfg, rate, B * P, steps, B, keys, false);
            /* a member in the sequential order costs what the reference
             * does with the sequential matmul; the shadow, in doubles
             * summed one at a time, about twice that */
            const double seq_s = kv_rate_decode_seconds(cfg, rate, B * P, steps, B, keys, true);
            const double cand_s =
                kv_rate_decode_seconds(cfg, rate, B * (P - shared), steps + replays, B,
                                       run_keys_steps(cfg, use, S, shared), false);
            const double ref_cut_s =
                cut_cols > 0 ? kv_rate_decode_seconds(cfg, rate, B * P - cut_cols, steps, B,
                                                      run_keys_steps(cfg, use, S, cut_cols),
                                                      false)
                             : ref_s;
            /* a twin cut from the stream: its decode steps (its context's
             * pairs as the reference's after the cut) */
            const double twin_s =
                !twin ? 0.0
                : twin_cut > 0 ? kv_rate_decode_seconds(cfg, rate, 0, steps, B,
                                                         run_keys_steps(cfg, use, S, P), false)
                               : ref_s;
            double unit_s = ref_cut_s + twin_s + (double)cands * cand_s;
            if (rows_alone_applies(use)) {
                /* each row again alone, on its real tokens (a row cut from
                 * the stream takes its cut again) */
                for (int64_t b = 0; b < B; b++) {
                    int64_t real = 0;
                    for (int64_t t = 0; t < P; t++) real += use->real[b * P + t];
                    if (b == 0 && cut_cols == P) real = 0;
                    unit_s += kv_rate_decode_seconds(cfg, rate, real, steps, 1, keys / (double)B,
                                                     false);
                }
            }
            if (calibrates && needed) unit_s += ref_s + 2.0 * seq_s;
            if (calibrates) {
                unit_s += 2.0 * kv_rate_decode_seconds(cfg, rate, real_positions, steps, B, keys,
                                                       true);
            }
            w->seconds += unit_s;
        }
        kv_scenario_free(&sc);
    }
    return KV_OK;
}

/* Whether the calibration's reduction-order members are run on model cfg
 * (DESIGN §6). The spread they measure sets the tolerance, and at real
 * scale only two kinds of comparison are judged by a tolerance: a run on a
 * backend other than the CPU (CUDA reduces in its own orders), and a
 * context shift's shifted-vs-fresh run on a model where it is judged. CPU
 * candidates are held bitwise to the reference, so a gate of only those
 * decides nothing by the spread, and the members would cost three
 * reference decodes of the largest unit. The fp64 shadow, which judges the
 * reference, runs either way. The tiny set, a sharded gate and a custom
 * batch (--prompts, --external) calibrate per unit, always in full. */
KvStatus kv_gate_members_needed(const KvConfig *cfg, const KvGateOptions *o, bool *needed,
                                KvError *err) {
    *needed = o->calibrate;
    if (!kv_gate_calibrates_per_model(cfg, o)) return KV_OK;
    *needed = false;
    for (int i = 0; i < o->n_backends && !*needed; i++) {
        *needed = o->backends[i].skip[0] == '\0' && !o->backends[i].ops->host;
    }
    for (int i = 0; i < o->n_scenarios && !*needed; i++) {
        KvScenario sc;
        KvStatus st = kv_scenario_build(cfg, o->scenarios[i], o->prompt_seed, &sc, err);
        if (st != KV_OK) return st;
        char why[256];
        *needed = kv_scenario_shifts(&sc) && kv_scenario_shift_judged(cfg, why, sizeof why);
        kv_scenario_free(&sc);
    }
    return KV_OK;
}

/* Whether the units of model m calibrate once, on one of them, instead of
 * each its own (DESIGN §6): the real-scale set, calibrated, one shard (a
 * shard that does not hold the calibration unit would have no tolerance). */
bool kv_gate_calibrates_per_model(const KvConfig *cfg, const KvGateOptions *o) {
    return o->calibrate && o->custom == NULL && o->shard_n == 1 && o->n_scenarios > 1 &&
           kv_scenario_scale(cfg) == KV_SCALE_REAL;
}

/* The unit whose calibration the model's units share: the scenario with
 * the most token positions (rows x (prompt + decode)), where rounding has
 * the longest sums and the most steps to gather; the first of equals. */
static KvStatus gate_calibration_unit(const KvConfig *cfg, const KvGateOptions *o, int *pick,
                                      KvError *err) {
    int64_t best = -1;
    *pick = 0;
    for (int i = 0; i < o->n_scenarios; i++) {
        KvScenario sc;
        KvStatus st = kv_scenario_build(cfg, o->scenarios[i], o->prompt_seed, &sc, err);
        if (st != KV_OK) return st;
        int64_t steps = sc.new_tokens;
        if (o->max_new_tokens > 0 && steps > o->max_new_tokens) steps = o->max_new_tokens;
        const int64_t positions = sc.batch * (sc.prompt_len + steps);
        if (positions > best) {
            best = positions;
            *pick = i;
        }
        kv_scenario_free(&sc);
    }
    return KV_OK;
}

static int gate_calibration_unit_of(const KvConfig *cfg, const KvGateOptions *o, KvError *err,
                                    KvStatus *st) {
    int pick = 0;
    *st = gate_calibration_unit(cfg, o, &pick, err);
    return pick;
}

bool kv_gate_failed_since(const KvReport *rep, int64_t from) {
    for (int64_t c = from; c < rep->n_comparisons; c++) {
        if (rep->comparisons[c].verdict == KV_VERDICT_FAIL) return true;
    }
    return false;
}

/* The stream's progress: its layer, and its share of its estimate. */
typedef struct {
    const KvGateOptions *o;
    const char *model;
    int64_t n, layers;
    double est;
} StreamWatch;

static void stream_progress(void *ctx, int64_t layer) {
    const StreamWatch *w = ctx;
    if (w->o->est_running != NULL) {
        *w->o->est_running = w->est * (double)(layer + 1) / (double)w->layers;
    }
    char cur[320];
    snprintf(cur, sizeof cur, "%s stream: one prefill of %lld tokens (layer %lld of %lld)",
             w->model, (long long)w->n, (long long)layer + 1, (long long)w->layers);
    kv_gate_progress_print(w->o, cur, false);
}

/* Records the model's stream (stream_tape.h) when its units share one:
 * *t unfilled otherwise. */
static KvStatus gate_stream_record(const KvModel *m, const char *model_name,
                                   const KvGateOptions *o, int unit, KvStreamTape *t,
                                   KvError *err) {
    int64_t cut[KV_PROBE_CUT_MAX], n_cut = 0;
    KvStatus st = gate_stream_cuts(&m->config, o, unit, cut, &n_cut, err);
    if (st != KV_OK || n_cut == 0) return st;
    const int64_t n = cut[n_cut - 1];
    int32_t *tokens = malloc((size_t)n * sizeof *tokens); /* (n) */
    if (tokens == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    kv_scenario_stream(&m->config, o->prompt_seed, n, tokens);
    double est = 0.0;
    if (o->rate != NULL && o->est_done != NULL) {
        est = kv_rate_decode_seconds(&m->config, o->rate, n, 0, 1,
                                     prefill_keys(&m->config, n), false);
    }
    char cur[320];
    snprintf(cur, sizeof cur, "%s stream: one prefill of %lld tokens, cut for %lld references",
             model_name, (long long)n, (long long)n_cut);
    kv_gate_progress_print(o, cur, false);
    StreamWatch watch = {o, model_name, n, m->config.num_layers, est};
    st = kv_stream_tape_record(m, tokens, n, cut, n_cut, stream_progress, &watch, t, err);
    free(tokens);
    if (o->est_running != NULL) *o->est_running = 0.0;
    if (o->est_done != NULL) *o->est_done += est;
    return st;
}

KvStatus kv_gate_run_model(const KvModel *m, const char *model_name, const KvGateOptions *o,
                           int *unit, KvReport *rep, KvError *err) {
    const int n = o->custom != NULL ? 1 : o->n_scenarios;
    const bool per_model = kv_gate_calibrates_per_model(&m->config, o);
    int cal = -1; /* the calibration unit, run first */
    if (per_model) {
        KvStatus st = gate_calibration_unit(&m->config, o, &cal, err);
        if (st != KV_OK) return st;
    }
    /* the references' first rows, computed once (stream_tape.h) */
    KvStreamTape stream = {0};
    KvGateOptions with_stream = *o;
    KvStatus st = gate_stream_record(m, model_name, o, *unit, &stream, err);
    if (st != KV_OK) return st;
    if (stream.filled) {
        with_stream.stream = &stream;
        o = &with_stream;
    }
    KvTolerances model_tol = o->tol;
    /* a pass given its clean pass's tolerance calibrates no unit */
    const bool fixed = per_model && o->model_tol_in != NULL;
    const bool stops = o->stop_at_catch && o->faults != 0;
    const int64_t planned = kv_gate_runs_planned_per_unit(o);
    const int64_t from = rep->n_comparisons;
    for (int k = 0; k < n; k++) {
        /* per model: the calibration unit first, then the others in order */
        const int i = !per_model || fixed ? k : k == 0 ? cal : k <= cal ? k - 1 : k;
        if (!kv_gate_unit_in_shard(o, *unit + i)) continue;
        if (stops && kv_gate_failed_since(rep, from)) {
            /* caught: the rest of this pass is not run, and counted as such */
            if (o->runs_stopped != NULL) *o->runs_stopped += planned;
            continue;
        }
        const int64_t accounted = o->runs_accounted != NULL ? *o->runs_accounted : 0;
        const int64_t unit_from = rep->n_comparisons;
        KvScenario sc = {0};
        const KvScenario *use = o->custom;
        if (use == NULL) {
            st = kv_scenario_build(&m->config, o->scenarios[i], o->prompt_seed, &sc, err);
            if (st != KV_OK) goto cleanup;
            if (o->max_new_tokens > 0 && sc.new_tokens > o->max_new_tokens) {
                sc.new_tokens = o->max_new_tokens;
            }
            use = &sc;
        }
        const bool shared = per_model && i != cal;
        st = run_scenario(m, model_name, use, o,
                          fixed ? o->model_tol_in : shared ? &model_tol : NULL,
                          per_model ? o->scenarios[cal] : NULL,
                          per_model && !fixed && i == cal ? &model_tol : NULL, rep, err);
        kv_scenario_free(&sc);
        if (st != KV_OK) goto cleanup;
        /* a unit the catch cut short: the runs it did not make. Only a unit
         * that caught the fault: a shortfall anywhere else stays owed, and
         * fails the gate as a run that silently did not happen. */
        if (stops && o->runs_stopped != NULL && o->runs_accounted != NULL &&
            kv_gate_failed_since(rep, unit_from)) {
            *o->runs_stopped += planned - (*o->runs_accounted - accounted);
        }
    }
    if (per_model && !fixed && o->model_tol_out != NULL) *o->model_tol_out = model_tol;
    *unit += n;
cleanup:
    kv_stream_tape_free(&stream);
    return st;
}
