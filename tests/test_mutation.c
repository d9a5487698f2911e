/* test_mutation.c: the planted faults (DESIGN §7) against the default gate,
 * and bisect locating each one.
 *
 * gate_<fault>: the default gate matrix (the tiny mistral and gemma3, every
 * default scenario, every variant, eager and graph, 3 repeats, replay check
 * every 5 steps) with the fault planted must fail at least one comparison.
 * gate_clean: the same matrix clean, over four tiny families, must fail none
 * (no false alarm).
 * bisect: for each fault, the faulty variant against the same variant clean
 * is bisected from probe hashes to the probe the catalog says the fault acts
 * on; the rerun reproduces both recordings, the located probe's full values
 * differ and its inputs' do not. A fault that acts on no probe
 * (recapture_every_step) must leave every probe as it was.
 * bisect_walkback: recorded hashes made to agree where the values differ
 * (a probe hash over part of a tensor) make bisect blame final_norm; the
 * walk back over the reruns' full values finds the true first divergence.
 * gate_forcing: a flip at a near-tie teacher-forces every run of that
 * variant alike, so repeats and modes still compare bitwise.
 * gate_budget: a graph re-captured every step fails the gate by its graph
 * count alone; clean graph runs record their budget and stay within it.
 *
 * Usage: test_mutation [TCASE] runs one test case (ctest runs them as
 * separate tests so they spread over cores); no argument runs all. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bisect.h"
#include "cache.h"
#include "cache_registry.h"
#include "compare.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "forward.h"
#include "junit.h"
#include "kvmath.h"
#include "matrix.h"
#include "mutation.h"
#include "scenario.h"
#include "script.h"

/* the default gate's models (cmd_gate.c) but gpt_oss-tiny, left out to keep the eleven
 * fault passes inside the suite's time budget (its faults are the same code paths) */
static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny"};
#define N_FAM ((int)(sizeof k_families / sizeof k_families[0]))
/* A fault pass runs an all-sliding and a hybrid family (mistral, gemma3):
 * every fault acts in code they share with the other two; the clean pass
 * runs all four (no false alarm on any). */
static const char *const k_fault_families[] = {"mistral-tiny", "gemma3-tiny"};
#define N_FAULT_FAM ((int)(sizeof k_fault_families / sizeof k_fault_families[0]))

/* The options `kvrepro gate` runs with when given none (cmd_gate.c; the
 * variants take the reference's first prefill forward, prefill_tape.h), CPU
 * only: CUDA runs are skipped without a device and cannot catch anything.
 * A fault pass leaves out the scripted scenarios (prefix_reuse_after_wrap,
 * speculative_rollback_past_window: the default set's last two), which only
 * prefix_alias needs, and the extended ones: the right-padded two, which
 * only pad_slots needs, and context_shift, which only shift_cells needs
 * (their passes run those alone), to keep the fault passes
 * inside the suite's time budget; the clean pass runs all of them. That the existing
 * faults are caught there too is `gate --faults all`'s and test_variants'
 * (static_layer). */
static KvGateOptions default_gate(unsigned faults, const KvCacheOps *const *variants,
                                  int n_variants) {
    /* Read only: the CPU backend never skips, so nothing writes its reason. */
    static KvGateBackend cpu_only = {&kv_backend_cpu, ""};
    int n_scen = 0, n_default = 0;
    const char *const *scen = kv_scenario_all_names(&n_scen);
    kv_scenario_names(&n_default);
    if (faults & (KV_FAULT_PAD_SLOTS | KV_FAULT_SHIFT_CELLS)) {
        /* only the extended, right-padded scenarios have right pads; only
         * context_shift shifts */
        ck_assert_str_eq(scen[n_default], "right_padded_static_loop");
        ck_assert_str_eq(scen[n_default + 2], "context_shift");
        ck_assert_int_eq(n_scen, n_default + 3);
        const bool pad = (faults & KV_FAULT_PAD_SLOTS) != 0;
        return (KvGateOptions){
            .scenarios = scen + n_default + (pad ? 0 : 2), .n_scenarios = pad ? 2 : 1,
            .variants = variants, .n_variants = n_variants, .backends = &cpu_only,
            .n_backends = 1, .eager = true, .graph = true, .repeats = 3, .replay_every = 5,
            .faults = faults, .tol = kv_tolerances_default(), .calibrate = true,
            .share_prefill = true, .prompt_seed = KV_FIXTURE_DEFAULT_SEED, .shard_i = 1, .shard_n = 1,
            .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
        };
    }
    if (faults != 0) {
        /* the default set only, without its scripted last two */
        ck_assert_str_eq(scen[n_default - 2], "prefix_reuse_after_wrap");
        ck_assert_str_eq(scen[n_default - 1], "speculative_rollback_past_window");
        n_scen = n_default - ((faults & KV_FAULT_PREFIX_ALIAS) ? 0 : 2);
    }
    return (KvGateOptions){
        .scenarios = scen, .n_scenarios = n_scen, .variants = variants,
        .n_variants = n_variants, .backends = &cpu_only, .n_backends = 1, .eager = true, .graph = true,
        .repeats = 3, .replay_every = 5, .faults = faults, .tol = kv_tolerances_default(),
        .calibrate = true, .share_prefill = true,
        .prompt_seed = KV_FIXTURE_DEFAULT_SEED, .shard_i = 1, .shard_n = 1,
        .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
    };
}

/* Runs the default gate over the tiny families with `faults` planted (a
 * fault pass: k_fault_families). */
static KvMutationPass gate_pass(unsigned faults) {
    int n_var = 0;
    const KvCacheOps *const *all = kv_cache_all(&n_var);
    const KvGateOptions o = default_gate(faults, all, n_var);
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvMutationPass p = {.faults = faults, .first_fail = -1};
    int unit = 0;
    const char *const *fams = faults != 0 ? k_fault_families : k_families;
    const int n_fam = faults != 0 ? N_FAULT_FAM : N_FAM;
    for (int f = 0; f < n_fam; f++) {
        KvFixtureModel fx;
        KvError err = {{0}};
        ck_assert_msg(kv_fixture_load(fams[f], KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK,
                      "%s", err.msg);
        const int64_t from = rep.n_comparisons;
        ck_assert_msg(kv_gate_run_model(&fx.model, fams[f], &o, &unit, &rep, &err) == KV_OK,
                      "%s", err.msg);
        kv_mutation_account(&p, &rep, from, rep.n_comparisons);
        kv_fixture_free(&fx);
    }
    if (p.failed > 0 && faults == 0) {
        char line[512];
        kv_report_run_divergence(&rep, rep.comparisons[p.first_fail].run_b, line, sizeof line);
        fprintf(stderr, "false alarm: %s\n", line);
    }
    kv_report_free(&rep);
    return p;
}

START_TEST(test_gate_clean_no_false_alarm) {
    const KvMutationPass p = gate_pass(0);
    ck_assert_int_gt(p.comparisons, 0);
    ck_assert_msg(p.failed == 0, "%lld of %lld clean comparisons failed", (long long)p.failed,
                  (long long)p.comparisons);
}
END_TEST

/* _i: index into the fault catalog. */
START_TEST(test_gate_catches_fault) {
    int n = 0;
    const KvFaultInfo *f = &kv_fault_all(&n)[_i];
    const KvMutationPass p = gate_pass(f->bit);
    ck_assert_msg(p.failed > 0, "fault %s: none of %lld comparisons failed: the default gate "
                  "does not catch it", f->name, (long long)p.comparisons);
}
END_TEST

/* ---- bisect ---- */

/* Where each fault acts, so bisecting it is meaningful: the variant that
 * carries it (every variant for forward faults), the mode that exposes it
 * and a scenario in which it acts. */
typedef struct {
    const char *fault, *variant, *scenario;
    KvExecMode mode;
} FaultSite;

static const FaultSite k_sites[KV_FAULT_COUNT] = {
    {"stale_scalar", "ring", "short_prompt_crosses_window", KV_MODE_GRAPH},
    {"atomic_reduction", "index_copy", "short_prompt_crosses_window", KV_MODE_EAGER},
    {"inplace_shift", "cat_shift", "short_prompt_crosses_window", KV_MODE_EAGER},
    {"window_off_by_one", "always_roll", "prompt_w_plus_1", KV_MODE_EAGER},
    {"prefill_first_w", "index_copy", "prefill_longer_than_window", KV_MODE_EAGER},
    {"unwritten_slot", "ring", "short_prompt_crosses_window", KV_MODE_EAGER},
    {"no_recapture", "roll", "short_prompt_crosses_window", KV_MODE_GRAPH},
    {"tf32", "dynamic", "prompt_w", KV_MODE_EAGER},
    {"recapture_every_step", "ring", "short_prompt_crosses_window", KV_MODE_GRAPH},
    {"ring_slot", "ring", "short_prompt_crosses_window", KV_MODE_EAGER},
    {"dynamic_keeps_w", "dynamic", "short_prompt_crosses_window", KV_MODE_GRAPH},
    {"static_layer", "index_copy", "short_prompt_crosses_window", KV_MODE_GRAPH},
    {"prefix_alias", "ring", "prefix_reuse_after_wrap", KV_MODE_EAGER},
    {"pad_slots", "ring", "right_padded_static_loop", KV_MODE_EAGER},
    {"shift_cells", "ring", "context_shift", KV_MODE_GRAPH},
    {"racy_shift", "roll", "short_prompt_crosses_window", KV_MODE_EAGER},
};

/* A decode of family's fixture m recorded as the gate records its runs. */
static void record_run(const KvModel *m, const char *family, const KvScenario *sc,
                       const FaultSite *site, unsigned faults, KvRun *run) {
    kv_run_init(run);
    KvDecodeSpec spec = {
        .batch = sc->batch, .prompt_len = sc->prompt_len, .prompt = sc->prompt,
        .prompt_real = sc->real, .new_tokens = sc->new_tokens, .prefill_chunk = sc->prefill_chunk,
        .variant = kv_cache_find(site->variant), .mode = site->mode, .faults = faults,
        .record_probes = true,
    };
    KvScript script = kv_script_of_scenario(sc);
    KvDecodeResult r;
    KvError err = {{0}};
    ck_assert_msg(kv_script_decode(NULL, &script, m, &spec, &r, NULL, &err) == KV_OK, "%s",
                  err.msg);
    kv_run_identify(run, family, sc->name, site->variant, "cpu",
                    site->mode == KV_MODE_GRAPH ? "graph" : "eager", 0, faults);
    ck_assert_msg(kv_run_from_result(run, &m->config, &spec, &script, &r, &err) == KV_OK, "%s",
                  err.msg);
}

/* Family fam's fixture, site's scenario on it, and that scenario decoded
 * at site clean and with fault bit planted: what each bisect test starts
 * from. */
typedef struct {
    KvFixtureModel fx;
    KvScenario sc;
    KvRun clean, faulty;
} SitePair;

static void site_pair_record(int fam, const FaultSite *site, unsigned bit, SitePair *p) {
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[fam], KV_FIXTURE_DEFAULT_SEED, &p->fx, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_msg(kv_scenario_build(&p->fx.model.config, site->scenario, KV_FIXTURE_DEFAULT_SEED,
                                    &p->sc, &err) == KV_OK, "%s", err.msg);
    record_run(&p->fx.model, k_families[fam], &p->sc, site, 0, &p->clean);
    record_run(&p->fx.model, k_families[fam], &p->sc, site, bit, &p->faulty);
}

static void site_pair_free(SitePair *p) {
    kv_run_free(&p->clean);
    kv_run_free(&p->faulty);
    kv_scenario_free(&p->sc);
    kv_fixture_free(&p->fx);
}

/* Bisect's reruns of the clean (ra) and the faulty (rb) run at the step it
 * blamed: the blamed probe's full values differ in row, its inputs' agree.
 * who: what the failure messages start with. */
static void assert_probe_blamed(const KvDecodeResult *ra, const KvDecodeResult *rb,
                                const KvRun *clean, int64_t probe, int64_t row, const char *who) {
    const int64_t B = clean->batch;
    KvBisectDiff d;
    kv_bisect_diff(ra->dump.data[probe], ra->dump.len[probe], rb->dump.data[probe],
                   rb->dump.len[probe], B, row, &d);
    ck_assert_msg(d.differs && (d.shape_differs || d.first_index >= 0),
                  "%s: the dumps of %s do not differ in row %lld", who,
                  clean->probe_names[probe], (long long)row);
    int64_t in[2];
    const int n_in = kv_bisect_inputs(clean->n_probes, probe, in);
    for (int k = 0; k < n_in; k++) {
        kv_bisect_diff(ra->dump.data[in[k]], ra->dump.len[in[k]], rb->dump.data[in[k]],
                       rb->dump.len[in[k]], B, row, &d);
        ck_assert_msg(!d.differs, "%s: input %s of %s differs", who, clean->probe_names[in[k]],
                      clean->probe_names[probe]);
    }
}

/* _i: index into the fault catalog; both families. */
START_TEST(test_bisect_locates_fault) {
    int n = 0;
    const KvFaultInfo *f = &kv_fault_all(&n)[_i];
    const FaultSite *site = &k_sites[_i];
    ck_assert_str_eq(site->fault, f->name);
    for (int fam = 0; fam < N_FAM; fam++) {
        SitePair sp;
        site_pair_record(fam, site, f->bit, &sp);
        KvRun *clean = &sp.clean, *faulty = &sp.faulty;
        KvError err = {{0}};
        KvBisectPoint pt;
        ck_assert_msg(kv_bisect_find(clean, faulty, &pt, &err) == KV_OK, "%s", err.msg);
        if (f->acts_on == NULL) {
            /* Nothing for bisect: the fault shows in the graph count alone. */
            ck_assert_msg(pt.step < 0, "%s %s: a probe differs at step %lld; the fault should "
                          "change the graph count only", k_families[fam], f->name,
                          (long long)pt.step);
            ck_assert_msg(faulty->graphs_captured > clean->graphs_captured,
                          "%s %s: %lld graphs captured, clean %lld", k_families[fam], f->name,
                          (long long)faulty->graphs_captured, (long long)clean->graphs_captured);
            site_pair_free(&sp);
            continue;
        }
        ck_assert_msg(pt.step >= 0 && !pt.by_tokens, "%s %s: no probe divergence found",
                      k_families[fam], f->name);
        const char *probe = clean->probe_names[pt.probe];
        const char *dot = strchr(probe, '.');
        ck_assert_msg(dot != NULL && strcmp(dot + 1, f->acts_on) == 0,
                      "%s %s: bisect located %s at step %lld, expected a %s probe",
                      k_families[fam], f->name, probe, (long long)pt.step, f->acts_on);
        fprintf(stderr, "%s %s %s/%s: step %lld row %lld %s\n", k_families[fam], f->name,
                site->variant, clean->mode, (long long)pt.step, (long long)pt.row, probe);

        /* The rerun: the located probe's values differ, its inputs' agree.
         * atomic_reduction is nondeterministic by design (its clock runs on
         * across decodes), so its reruns need not reproduce the recording. */
        KvDecodeResult ra, rb;
        ck_assert_msg(kv_bisect_rerun(&sp.fx.model, clean, pt.step, &ra, &err) == KV_OK, "%s",
                      err.msg);
        ck_assert_msg(kv_bisect_rerun(&sp.fx.model, faulty, pt.step, &rb, &err) == KV_OK, "%s",
                      err.msg);
        const int64_t NP = clean->n_probes, B = clean->batch;
        const int64_t rec = (pt.step * NP + pt.probe) * B + pt.row;
        const int64_t now = ((ra.steps - 1) * NP + pt.probe) * B + pt.row;
        ck_assert(ra.probe_hash[now] == clean->probe_hash[rec]);
        if (f->bit != KV_FAULT_ATOMIC_REDUCTION) {
            ck_assert_msg(rb.probe_hash[now] == faulty->probe_hash[rec],
                          "%s: the faulty rerun does not reproduce its recording", f->name);
            assert_probe_blamed(&ra, &rb, clean, pt.probe, pt.row, f->name);
        }
        kv_decode_result_free(&ra);
        kv_decode_result_free(&rb);
        site_pair_free(&sp);
    }
}
END_TEST

/* ---- the walk back ---- */

/* Faults whose runs differ in final_norm from their first divergence on,
 * so hashes hidden up to final_norm make bisect blame it: an eager one and
 * a graph one (the per-step dumps come from the replays). */
static const char *const k_walk_faults[] = {"window_off_by_one", "stale_scalar"};

/* Run b's recorded hashes at step s made run a's for probes 0..last, as a
 * probe hash over part of a tensor would record them; with `token`, its
 * token and logits hash at s too (else bisect stops at a differing token
 * or logits row). */
static void hide_step(const KvRun *a, KvRun *b, int64_t s, int64_t last, bool token) {
    const int64_t NP = b->n_probes, B = b->batch;
    memcpy(&b->probe_hash[s * NP * B], &a->probe_hash[s * NP * B],
           (size_t)((last + 1) * B) * sizeof *b->probe_hash);
    if (!token) return;
    memcpy(&b->tokens[s * B], &a->tokens[s * B], (size_t)B * sizeof *b->tokens);
    memcpy(&b->logits_hash[s * B], &a->logits_hash[s * B], (size_t)B * sizeof *b->logits_hash);
}

/* _i: fault (k_walk_faults) x where the hashes blame final_norm: at the true
 * first divergence's step (0), or a step later with that step hidden (1);
 * both families. The walk back must find the true first divergence from
 * the reruns' full values, and its dumps differ where its inputs' do not. */
START_TEST(test_bisect_walks_back_hidden_hashes) {
    const char *fault = k_walk_faults[_i / 2];
    const int64_t later = _i % 2;
    int n = 0;
    const KvFaultInfo *all = kv_fault_all(&n);
    int fi = 0;
    while (fi < n && strcmp(all[fi].name, fault) != 0) fi++;
    ck_assert_int_lt(fi, n);
    const FaultSite *site = &k_sites[fi];
    for (int fam = 0; fam < N_FAM; fam++) {
        SitePair sp;
        site_pair_record(fam, site, all[fi].bit, &sp);
        KvRun *clean = &sp.clean, *faulty = &sp.faulty;
        KvError err = {{0}};
        const int64_t NP = clean->n_probes, B = clean->batch, fnorm = NP - 2;
        KvBisectPoint truth, named;
        ck_assert_msg(kv_bisect_find(clean, faulty, &truth, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(truth.step >= 0 && !truth.by_tokens && truth.probe < fnorm,
                      "%s %s: expected a probe divergence before final_norm", k_families[fam],
                      fault);
        const int64_t s_named = truth.step + later;
        ck_assert_int_lt(s_named, clean->steps);
        bool fnorm_differs = false;
        for (int64_t r = 0; r < B; r++) {
            const int64_t i = (s_named * NP + fnorm) * B + r;
            fnorm_differs = fnorm_differs || clean->probe_hash[i] != faulty->probe_hash[i];
        }
        ck_assert_msg(fnorm_differs, "%s %s: final_norm agrees at step %lld: nothing to blame",
                      k_families[fam], fault, (long long)s_named);
        if (later) hide_step(clean, faulty, truth.step, NP - 1, true);
        hide_step(clean, faulty, s_named, fnorm - 1, false);
        ck_assert_msg(kv_bisect_find(clean, faulty, &named, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(named.step == s_named && named.probe == fnorm,
                      "%s %s: the edited hashes should name final_norm at step %lld, named "
                      "probe %lld at step %lld", k_families[fam], fault, (long long)s_named,
                      (long long)named.probe, (long long)named.step);

        KvDecodeResult ra, rb;
        uint64_t *da = NULL, *db = NULL;
        ck_assert_msg(kv_bisect_rerun_digests(&sp.fx.model, clean, named.step, &ra, &da, &err) ==
                      KV_OK, "%s", err.msg);
        ck_assert_msg(kv_bisect_rerun_digests(&sp.fx.model, faulty, named.step, &rb, &db, &err) ==
                      KV_OK, "%s", err.msg);
        ck_assert(da != NULL && db != NULL);
        KvBisectPoint at;
        kv_bisect_walk_back(da, db, NP, B, &named, &at);
        ck_assert_msg(at.step == truth.step && at.probe == truth.probe && at.row == truth.row,
                      "%s %s: walked back to step %lld row %lld probe %s, expected step %lld "
                      "row %lld probe %s", k_families[fam], fault, (long long)at.step,
                      (long long)at.row, at.probe >= 0 ? clean->probe_names[at.probe] : "(none)",
                      (long long)truth.step, (long long)truth.row,
                      clean->probe_names[truth.probe]);
        ck_assert_int_eq(at.layer, kv_probe_layer(NP, truth.probe));
        fprintf(stderr, "%s %s: hashes named final_norm at step %lld, walked back to %s at step "
                "%lld\n", k_families[fam], fault, (long long)named.step,
                clean->probe_names[at.probe], (long long)at.step);
        kv_decode_result_free(&ra);
        kv_decode_result_free(&rb);
        free(da);
        free(db);

        /* The walked-back probe's full values differ, its inputs' agree. */
        ck_assert_msg(kv_bisect_rerun(&sp.fx.model, clean, at.step, &ra, &err) == KV_OK, "%s",
                      err.msg);
        ck_assert_msg(kv_bisect_rerun(&sp.fx.model, faulty, at.step, &rb, &err) == KV_OK, "%s",
                      err.msg);
        char who[128];
        snprintf(who, sizeof who, "%s %s, walked back", k_families[fam], fault);
        assert_probe_blamed(&ra, &rb, clean, at.probe, at.row, who);
        kv_decode_result_free(&ra);
        kv_decode_result_free(&rb);
        site_pair_free(&sp);
    }
}
END_TEST

/* ---- the gate's own rules: teacher forcing alike, graph budgets ---- */

/* The gate on one family and scenario, every variant, both modes, two
 * repeats, the default replay check, with `faults` planted and tolerances
 * tol, into *rep (freed by the caller). Returns the model's sliding window. */
static int64_t small_gate(const char *family, const char *scenario, unsigned faults,
                          KvTolerances tol, KvReport *rep) {
    int n_var = 0;
    const KvCacheOps *const *all = kv_cache_all(&n_var);
    KvGateOptions o = default_gate(faults, all, n_var);
    const char *const scen[] = {scenario};
    o.scenarios = scen;
    o.n_scenarios = 1;
    o.repeats = 2;
    o.tol = tol;
    memset(rep, 0, sizeof *rep);
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(family, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK, "%s",
                  err.msg);
    int unit = 0;
    ck_assert_msg(kv_gate_run_model(&fx.model, family, &o, &unit, rep, &err) == KV_OK, "%s",
                  err.msg);
    const int64_t window = fx.model.config.sliding_window;
    kv_fixture_free(&fx);
    return window;
}

/* A flip at a near-tie must not turn into a repeat failure.
 * window_off_by_one flips tokens deterministically on prompt_w_plus_1;
 * with tie_margin 1 those flips count as near-ties, so each repeat 0 is
 * re-run teacher-forced. Its repeats and its graph mode must then be forced
 * alike: the fault is deterministic, so every bitwise comparison passes and
 * only the reference agreement (the fault's logits) fails. */
START_TEST(test_gate_near_tie_forces_alike) {
    KvTolerances tol = kv_tolerances_default();
    tol.tie_margin = 1.0;
    KvReport rep;
    small_gate("mistral-tiny", "prompt_w_plus_1", KV_FAULT_WINDOW_OFF_BY_ONE, tol, &rep);
    int64_t forced = 0, bitwise = 0;
    for (int64_t i = 0; i < rep.n_comparisons; i++) {
        const KvComparison *c = &rep.comparisons[i];
        if (c->kind == KV_CMP_REFERENCE) forced += c->near_ties > 0;
        if (c->kind != KV_CMP_REPEAT && c->kind != KV_CMP_GRAPH && c->kind != KV_CMP_VARIANT) {
            continue;
        }
        bitwise++;
        char line[512];
        kv_report_run_divergence(&rep, c->run_b, line, sizeof line);
        ck_assert_msg(c->verdict == KV_VERDICT_PASS, "%s failed: %s (%s)",
                      kv_compare_kind_name(c->kind), c->message, line);
    }
    ck_assert_msg(forced > 0, "no repeat 0 flipped at a near-tie: the test exercises nothing");
    ck_assert_int_gt(bitwise, 0);
    kv_report_free(&rep);
}
END_TEST

/* The comparisons of kind `kind` with run_b = run, counted into *n; the
 * last one found, or NULL. */
static const KvComparison *find_kind(const KvReport *rep, KvCompareKind kind, int64_t run,
                                     int *n) {
    const KvComparison *found = NULL;
    *n = 0;
    for (int64_t i = 0; i < rep->n_comparisons; i++) {
        if (rep->comparisons[i].kind != kind || rep->comparisons[i].run_b != run) continue;
        found = &rep->comparisons[i];
        ++*n;
    }
    return found;
}

/* Graph counts are judged. Clean: every graph-mode run
 * of every variant records its variant's budget and one passing
 * graph_budget comparison; eager runs and the reference record none.
 * recapture_every_step: the outputs are the clean ones, so only the graph
 * budget fails, on every graph-mode run, with the numbers. _i = family. */
START_TEST(test_gate_graph_budget) {
    const char *fam = k_families[_i];
    const char *scen = "short_prompt_crosses_window"; /* dynamic grows, cat_shift flips */
    for (int pass = 0; pass < 2; pass++) {
        const unsigned faults = pass == 0 ? 0u : KV_FAULT_RECAPTURE_EVERY_STEP;
        KvReport rep;
        const int64_t w = small_gate(fam, scen, faults, kv_tolerances_default(), &rep);
        int64_t graph_runs = 0;
        for (int64_t r = 0; r < rep.n_runs; r++) {
            const KvRun *run = &rep.runs[r];
            int n = 0;
            const KvComparison *c = find_kind(&rep, KV_CMP_GRAPH_BUDGET, r, &n);
            if (strcmp(run->mode, "graph") != 0) {
                ck_assert_int_eq(run->graph_budget, -1);
                ck_assert_int_eq(n, 0);
                continue;
            }
            graph_runs++;
            ck_assert_msg(n == 1 && c->run_a == r, "%s %s/%s/r%d: %d graph_budget comparisons",
                          fam, run->variant, run->mode, (int)run->repeat, n);
            const KvCacheOps *v = kv_cache_find(run->variant);
            ck_assert_ptr_nonnull(v);
            /* the variant's own rule with this run's window, prompt and
             * decode steps; DESIGN §3's table for the fixed ones */
            ck_assert_int_eq(run->graph_budget,
                             v->graph_budget(w, run->prompt_len, run->steps - 1));
            if (!v->host_shape) ck_assert_int_eq(run->graph_budget, v->host_branch ? 2 : 1);
            if (pass == 0) {
                ck_assert_msg(c->verdict == KV_VERDICT_PASS, "%s %s clean: %s", fam,
                              run->variant, c->message);
                /* dynamic's budget is exact: one graph per attended length */
                if (v->host_shape) {
                    ck_assert_int_eq(run->graphs_captured, run->graph_budget);
                    ck_assert_int_gt(run->graph_budget, 1);
                }
            } else {
                /* every decode step, and every replay of a checked one */
                ck_assert_int_ge(run->graphs_captured, run->steps - 1);
                ck_assert_msg(c->verdict == KV_VERDICT_FAIL &&
                                  strstr(c->message, "budget") != NULL,
                              "%s %s: a graph per step passed: %s", fam, run->variant,
                              c->message);
            }
        }
        ck_assert_int_eq(graph_runs, 6 * 2);
        KvMutationPass p = {.faults = faults, .first_fail = -1};
        kv_mutation_account(&p, &rep, 0, rep.n_comparisons);
        ck_assert_msg(p.kinds_failed == (pass == 0 ? 0u : 1u << KV_CMP_GRAPH_BUDGET),
                      "%s pass %d: comparison kinds failed 0x%x", fam, pass, p.kinds_failed);
        kv_report_free(&rep);
    }
}
END_TEST

/* static_layer (an exported static layer) changes nothing while the positions
 * fit in W slots and is seen at the first step past W: the decode step that
 * feeds position W (prompt P, step s >= 1 feeds position P + s - 1). */
START_TEST(test_static_layer_first_step_past_w) {
    static const char *const scen[] = {"short_prompt_crosses_window", "prompt_w_minus_1"};
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK,
                  "%s", err.msg);
    const int64_t w = fx.model.config.sliding_window;
    for (int k = 0; k < 2; k++) {
        KvScenario sc;
        ck_assert_msg(kv_scenario_build(&fx.model.config, scen[k], KV_FIXTURE_DEFAULT_SEED, &sc,
                                        &err) == KV_OK, "%s", err.msg);
        KvDecodeSpec spec = {
            .batch = sc.batch, .prompt_len = sc.prompt_len, .prompt = sc.prompt,
            .prompt_real = sc.real, .new_tokens = sc.new_tokens,
            .variant = &kv_cache_index_copy, .mode = KV_MODE_GRAPH,
        };
        KvDecodeResult clean, faulty;
        ck_assert_msg(kv_decode_greedy(&fx.model, &spec, &clean, &err) == KV_OK, "%s", err.msg);
        spec.faults = KV_FAULT_STATIC_LAYER;
        ck_assert_msg(kv_decode_greedy(&fx.model, &spec, &faulty, &err) == KV_OK, "%s", err.msg);
        const int64_t row = clean.batch * clean.vocab;
        int64_t first = -1;
        for (int64_t st = 0; st < clean.steps && first < 0; st++) {
            if (memcmp(clean.logits + st * row, faulty.logits + st * row,
                       (size_t)row * sizeof(float)) != 0) {
                first = st;
            }
        }
        ck_assert_msg(first >= 1 && sc.prompt_len + first - 1 == w,
                      "%s: static_layer first changed step %lld (prompt %lld, W %lld): expected "
                      "the step that feeds position W", scen[k], (long long)first,
                      (long long)sc.prompt_len, (long long)w);
        kv_decode_result_free(&clean);
        kv_decode_result_free(&faulty);
        kv_scenario_free(&sc);
    }
    kv_fixture_free(&fx);
}
END_TEST

/* The first failure shown for a fault is the first same-backend one when
 * there is one: a CUDA run against the CPU reference first differs at step
 * 0's first probe whatever the fault (first GPU run, docs/gpu-runs/). */
START_TEST(test_mutation_prefers_same_backend) {
    KvRun runs[3];
    memset(runs, 0, sizeof runs);
    snprintf(runs[0].backend, sizeof runs[0].backend, "cpu");
    snprintf(runs[1].backend, sizeof runs[1].backend, "cuda");
    snprintf(runs[2].backend, sizeof runs[2].backend, "cuda");
    KvComparison cmp[4];
    memset(cmp, 0, sizeof cmp);
    cmp[0] = (KvComparison){.kind = KV_CMP_REFERENCE, .run_a = 0, .run_b = 1,
                            .verdict = KV_VERDICT_PASS};
    cmp[1] = (KvComparison){.kind = KV_CMP_REFERENCE, .run_a = 0, .run_b = 2,
                            .verdict = KV_VERDICT_FAIL};
    cmp[2] = (KvComparison){.kind = KV_CMP_VARIANT, .run_a = 1, .run_b = 2,
                            .verdict = KV_VERDICT_FAIL};
    cmp[3] = (KvComparison){.kind = KV_CMP_VARIANT, .run_a = 1, .run_b = 2,
                            .verdict = KV_VERDICT_FAIL};
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    rep.runs = runs;
    rep.n_runs = 3;
    rep.comparisons = cmp;
    rep.n_comparisons = 4;
    KvMutationPass p = {.faults = 1, .first_fail = -1};
    kv_mutation_account(&p, &rep, 0, 2);
    ck_assert_int_eq(p.first_fail, 1); /* only a cross-backend failure so far */
    kv_mutation_account(&p, &rep, 2, 4);
    ck_assert_int_eq(p.first_fail, 2); /* the first same-backend one, kept */
    ck_assert_int_eq(p.failed, 3);
    ck_assert_int_eq(p.comparisons, 4);
    ck_assert_uint_eq(p.kinds_failed, (1u << KV_CMP_REFERENCE) | (1u << KV_CMP_VARIANT));
}
END_TEST

/* The scan order and bounds of kv_bisect_walk_back on made-up digests. */
START_TEST(test_bisect_walk_back_order) {
    enum { S = 3, NP = 3 + 7 * 2, B = 2 }; /* two layers */
    uint64_t da[S * NP * B], db[S * NP * B];
    for (int64_t i = 0; i < S * NP * B; i++) da[i] = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
    const KvBisectPoint named = {1, 1, 10, 1, false}; /* layer1.v, row 1, step 1 */
#define AT(s, p, r) (((s) * NP + (p)) * B + (r))
    KvBisectPoint at;
    memcpy(db, da, sizeof db);
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert_int_eq(at.step, -1); /* the rerun shows nothing */
    db[AT(1, 10, 1)] ^= 1;
    db[AT(1, 12, 0)] ^= 1; /* after the named probe: never reached */
    db[AT(2, 0, 0)] ^= 1;  /* a later step: never reached */
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert(at.step == 1 && at.probe == 10 && at.row == 1 && at.layer == 1); /* consistent */
    db[AT(1, 10, 0)] ^= 1;
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert(at.step == 1 && at.probe == 10 && at.row == 0); /* a lower row first */
    db[AT(1, 7, 1)] ^= 1; /* layer0.residual, the named probe's input */
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert(at.step == 1 && at.probe == 7 && at.row == 1 && at.layer == 0);
    db[AT(0, NP - 1, 1)] ^= 1; /* logits of an earlier step, which later steps do not read */
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert(at.step == 0 && at.probe == NP - 1 && at.row == 1 && at.layer == -1);
    db[AT(0, 0, 0)] ^= 1;
    kv_bisect_walk_back(da, db, NP, B, &named, &at);
    ck_assert(at.step == 0 && at.probe == 0 && at.row == 0);
    /* Never forward: a later row of the named probe is not a walk back. */
    const KvBisectPoint named_row0 = {1, 0, 10, 1, false};
    memcpy(db, da, sizeof db);
    db[AT(1, 10, 1)] ^= 1;
    kv_bisect_walk_back(da, db, NP, B, &named_row0, &at);
    ck_assert_int_eq(at.step, -1);
#undef AT
}
END_TEST

/* ---- building blocks ---- */

START_TEST(test_bisect_diff_elements) {
    /* (2 rows, 3) */
    const float a[6] = {1.0f, 2.0f, 3.0f, 0.0f, 5.0f, 6.0f};
    float b[6];
    memcpy(b, a, sizeof b);
    KvBisectDiff d;
    kv_bisect_diff(a, 3, b, 3, 2, 1, &d);
    ck_assert(!d.differs && d.first_index == -1 && d.max_abs_diff == 0.0);
    b[1] = nextafterf(2.0f, 3.0f); /* row 0: one ulp */
    b[3] = -0.0f;                  /* row 1: -0 vs +0 differ in bits, 0 ulp apart */
    b[5] = 6.5f;
    kv_bisect_diff(a, 3, b, 3, 2, 1, &d);
    ck_assert(d.differs);
    ck_assert_int_eq(d.first_index, 0);
    ck_assert_int_eq(d.ulp, 0);
    ck_assert(d.max_abs_diff == 0.5);
    kv_bisect_diff(a, 3, b, 3, 2, 0, &d);
    ck_assert_int_eq(d.first_index, 1);
    ck_assert_int_eq(d.ulp, 1);
    b[4] = NAN;
    kv_bisect_diff(a, 3, b, 3, 2, 1, &d);
    ck_assert(isinf(d.max_abs_diff));
    kv_bisect_diff(a, 3, b, 2, 2, 1, &d);
    ck_assert(d.shape_differs && d.differs);
}
END_TEST

START_TEST(test_bisect_inputs_map) {
    const int64_t NP = 3 + 7 * 2; /* two layers */
    int64_t in[2];
    ck_assert_int_eq(kv_bisect_inputs(NP, 0, in), 0);
    ck_assert_int_eq(kv_bisect_inputs(NP, 1, in), 1); /* layer0.q <- embed */
    ck_assert_int_eq(in[0], 0);
    ck_assert_int_eq(kv_bisect_inputs(NP, 4, in), 2); /* layer0.cache <- k, v */
    ck_assert(in[0] == 2 && in[1] == 3);
    ck_assert_int_eq(kv_bisect_inputs(NP, 5, in), 2); /* layer0.attn <- q, cache */
    ck_assert(in[0] == 1 && in[1] == 4);
    ck_assert_int_eq(kv_bisect_inputs(NP, 8 + 2, in), 1); /* layer1.v <- layer0.residual */
    ck_assert_int_eq(in[0], 7);
    ck_assert_int_eq(kv_bisect_inputs(NP, 14, in), 2); /* layer1.residual <- layer0.residual, mlp */
    ck_assert(in[0] == 7 && in[1] == 13);
    ck_assert_int_eq(kv_bisect_inputs(NP, NP - 1, in), 1); /* logits <- final_norm */
    ck_assert_int_eq(in[0], NP - 2);
    ck_assert_int_eq(kv_probe_layer(NP, 10), 1);
    ck_assert_int_eq(kv_probe_item(NP, 10), KV_PROBE_V);
    ck_assert_int_eq(kv_probe_layer(NP, NP - 2), -1);
    ck_assert_int_eq(kv_probe_item(NP, 0), -1);
}
END_TEST

START_TEST(test_round_tf32) {
    /* 10 mantissa bits: 1 + 2^-10 is exact; 1 + 2^-11 is a tie, to even (1);
     * 1 + 3 * 2^-11 is a tie, to even (1 + 2^-9); just above a tie rounds up. */
    ck_assert(kv_round_tf32(1.0f + 0x1p-10f) == 1.0f + 0x1p-10f);
    ck_assert(kv_round_tf32(1.0f + 0x1p-11f) == 1.0f);
    ck_assert(kv_round_tf32(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
    ck_assert(kv_round_tf32(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);
    ck_assert(kv_round_tf32(-1.0f - 0x1p-11f - 0x1p-20f) == -1.0f - 0x1p-10f);
    ck_assert(isnan(kv_round_tf32(NAN)));
    ck_assert(isinf(kv_round_tf32(INFINITY)));
}
END_TEST

START_TEST(test_fault_catalog) {
    int n = 0;
    const KvFaultInfo *all = kv_fault_all(&n);
    ck_assert_int_eq(n, KV_FAULT_COUNT);
    unsigned seen = 0;
    for (int i = 0; i < n; i++) {
        ck_assert(kv_fault_find(all[i].name) == &all[i]);
        ck_assert((seen & all[i].bit) == 0);
        seen |= all[i].bit;
    }
    ck_assert(kv_fault_find("nope") == NULL);
    char names[256];
    kv_fault_names(KV_FAULT_TF32 | KV_FAULT_STALE_SCALAR, names, sizeof names);
    ck_assert_str_eq(names, "stale_scalar,tf32");
    kv_fault_names(0, names, sizeof names);
    ck_assert_str_eq(names, "");
}
END_TEST

static Suite *mutation_suite(void) {
    Suite *s = suite_create("mutation");
    TCase *tc = tcase_create("gate_clean");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_gate_clean_no_false_alarm);
    suite_add_tcase(s, tc);
    int n = 0;
    const KvFaultInfo *all = kv_fault_all(&n);
    for (int i = 0; i < n; i++) {
        /* tcase names must outlive the suite */
        static char names[KV_FAULT_COUNT][64];
        snprintf(names[i], sizeof names[i], "gate_%s", all[i].name);
        tc = tcase_create(names[i]);
        tcase_set_timeout(tc, 900);
        tcase_add_loop_test(tc, test_gate_catches_fault, i, i + 1);
        suite_add_tcase(s, tc);
    }
    tc = tcase_create("gate_forcing");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_gate_near_tie_forces_alike);
    suite_add_tcase(s, tc);
    tc = tcase_create("gate_budget");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_gate_graph_budget, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("bisect");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_bisect_locates_fault, 0, KV_FAULT_COUNT);
    tcase_add_test(tc, test_bisect_diff_elements);
    tcase_add_test(tc, test_bisect_inputs_map);
    tcase_add_test(tc, test_round_tf32);
    tcase_add_test(tc, test_fault_catalog);
    tcase_add_test(tc, test_mutation_prefers_same_backend);
    tcase_add_test(tc, test_static_layer_first_step_past_w);
    suite_add_tcase(s, tc);
    tc = tcase_create("bisect_walkback");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_bisect_walks_back_hidden_hashes, 0,
                        (int)(2 * (sizeof k_walk_faults / sizeof k_walk_faults[0])));
    tcase_add_test(tc, test_bisect_walk_back_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    SRunner *sr = srunner_create(mutation_suite());
    srunner_run(sr, NULL, argc > 1 ? argv[1] : NULL, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
