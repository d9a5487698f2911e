/* bisect_craft.c: reports that `kvrepro bisect` must refuse, made from a
 * real gate report, and a /bisect group with awkward probe names.
 *
 *   bisect_craft craft GATE.h5 OUTDIR
 *     Reads a gate report (runs 0 and 1 must be two unskipped runs of one
 *     model with the forward's probe layout) and writes one edited copy per
 *     case below into OUTDIR/<case>.h5 through the project's own reader and
 *     writer, so every crafted file is a valid report: only the bisect-level
 *     consistency is broken. Cases edit every run (the two runs still agree,
 *     so only --rerun, which checks the runs against the model, can notice)
 *     or run 1 only (the runs disagree with each other: plain bisect must
 *     refuse too). bisect_layout.cmake runs bisect on each.
 *
 *   bisect_craft hide GATE.h5 OUTDIR
 *     Makes the recorded hashes of run 1 blame a later probe than the one
 *     at which runs 0 and 1 truly first differ (the effect of a probe
 *     hash that covers part of a tensor). The runs' first differing step s
 *     must have a differing final_norm. OUTDIR/hide_probe.h5: run 1's hashes
 *     of every probe before final_norm at step s made run 0's, so the hashes
 *     name final_norm at step s. OUTDIR/hide_step.h5: run 1's whole step s
 *     made run 0's (hashes, token, logits hash) and its probes before
 *     final_norm at step s + 1, so the hashes name final_norm at step s + 1.
 *     The values are untouched: a rerun differs where the runs truly do.
 *     Prints "first S P" (the true first step and probe) for the test.
 *
 *   bisect_craft names GATE.h5 OUT.h5
 *     Writes a /bisect group (kv_bisect_write_h5) whose probe names hold '/',
 *     '.' and a repeat, checks that the groups are named by index with the
 *     name as an attribute, and that two tensors of one index are refused.
 *
 * Exit 0 on success, 1 on a failed check, 2 on bad usage or input. */
#include <hdf5.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bisect_h5.h"
#include "report.h"
#include "report_h5.h"

/* The probe the edits act on: gemma2-tiny and mistral-tiny both have
 * embed, then layer0.q (1), .k, .v, .cache (4), .attn (5), ... */
#define CRAFT_PROBE_INSERT 1
#define CRAFT_PROBE_RENAME 4

/* Which runs a case edits. */
typedef enum { CRAFT_ALL, CRAFT_RUN1 } CraftScope;

typedef enum {
    CRAFT_EXTEND,       /* a probe "layer0.pre" inserted before layer0.q */
    CRAFT_EXTEND_TAIL,  /* a probe "extra" appended, hashed like logits; run 1's other
                         * hashes made run 0's, so the runs first differ there: an index
                         * past the model's probes (the old rerun read out of bounds) */
    CRAFT_SHRINK,       /* layer0.q removed */
    CRAFT_SHRINK_TAIL,  /* the last probe (logits) removed */
    CRAFT_RENAME,       /* layer0.cache renamed layer0.kv */
    CRAFT_SLASH,        /* layer0.cache renamed layer0/cache */
    CRAFT_DUP,          /* layer0.attn renamed layer0.cache (a repeat) */
    CRAFT_PROMPT_VOCAB, /* a prompt id outside the vocabulary */
    CRAFT_TOKEN_VOCAB,  /* a recorded token outside the vocabulary */
    CRAFT_VOCAB,        /* vocab attribute one larger */
    CRAFT_STEPS,        /* one step fewer */
    CRAFT_PROMPT_LEN,   /* one more (pad) prompt column */
    CRAFT_MODEL,        /* another model's name */
    CRAFT_MODEL_HASH,   /* the report's model hash changed (report-level) */
    CRAFT_WEIGHT_SEED,  /* the report's weight seed changed (report-level) */
} CraftEdit;

typedef struct {
    const char *name;
    CraftEdit edit;
    CraftScope scope;
} CraftCase;

static const CraftCase k_cases[] = {
    {"extended", CRAFT_EXTEND, CRAFT_ALL},
    {"extended_tail", CRAFT_EXTEND_TAIL, CRAFT_ALL},
    {"shrunk", CRAFT_SHRINK, CRAFT_ALL},
    {"shrunk_tail", CRAFT_SHRINK_TAIL, CRAFT_ALL},
    {"renamed", CRAFT_RENAME, CRAFT_ALL},
    {"slash", CRAFT_SLASH, CRAFT_ALL},
    {"dup", CRAFT_DUP, CRAFT_ALL},
    {"prompt_vocab", CRAFT_PROMPT_VOCAB, CRAFT_ALL},
    {"vocab", CRAFT_VOCAB, CRAFT_ALL},
    {"model_hash", CRAFT_MODEL_HASH, CRAFT_ALL},
    {"weight_seed", CRAFT_WEIGHT_SEED, CRAFT_ALL},
    {"pair_extended", CRAFT_EXTEND, CRAFT_RUN1},
    {"pair_shrunk", CRAFT_SHRINK, CRAFT_RUN1},
    {"pair_renamed", CRAFT_RENAME, CRAFT_RUN1},
    {"pair_slash", CRAFT_SLASH, CRAFT_RUN1},
    {"pair_dup", CRAFT_DUP, CRAFT_RUN1},
    {"pair_token", CRAFT_TOKEN_VOCAB, CRAFT_RUN1},
    {"pair_vocab", CRAFT_VOCAB, CRAFT_RUN1},
    {"pair_steps", CRAFT_STEPS, CRAFT_RUN1},
    {"pair_prompt", CRAFT_PROMPT_LEN, CRAFT_RUN1},
    {"pair_model", CRAFT_MODEL, CRAFT_RUN1},
};

/* The vocab attribute one larger: a top-k run stores no full logits, so no
 * array changes shape; a run that keeps its full rows (a reference, a
 * failing run) gets one more, lowest, logit per row so that the file stays
 * consistent and only the vocabulary disagrees with the model. */
static int craft_vocab(KvRun *r) {
    if (r->logits != NULL) {
        const int64_t rows = r->steps * r->batch, V = r->vocab;
        float *grown = malloc((size_t)(rows * (V + 1)) * sizeof *grown); /* (S, B, V + 1) */
        if (grown == NULL) return -1;
        for (int64_t i = 0; i < rows; i++) {
            memcpy(grown + i * (V + 1), r->logits + i * V, (size_t)V * sizeof *grown);
            grown[i * (V + 1) + V] = -1e30f;
        }
        free(r->logits);
        r->logits = grown;
    }
    r->vocab += 1;
    return 0;
}

/* Replaces run r's probe list: n_new probes, new probe q taken from old
 * probe map[q] (-1: a new probe named `fresh`, hashed like old probe
 * fresh_from). Returns 0, or -1 when out of memory. */
static int craft_probes(KvRun *r, int64_t n_new, const int64_t *map, const char *fresh,
                        int64_t fresh_from) {
    const int64_t S = r->steps, B = r->batch, NP = r->n_probes;
    char (*names)[KV_NAME_LEN] = calloc((size_t)n_new, sizeof *names);
    uint64_t *hash = calloc((size_t)(S * n_new * B) + 1, sizeof *hash);
    if (names == NULL || hash == NULL) {
        free(names);
        free(hash);
        return -1;
    }
    for (int64_t q = 0; q < n_new; q++) {
        const int64_t from = map[q] >= 0 ? map[q] : fresh_from;
        if (map[q] >= 0) {
            memcpy(names[q], r->probe_names[from], KV_NAME_LEN);
        } else {
            snprintf(names[q], KV_NAME_LEN, "%s", fresh);
        }
        for (int64_t s = 0; s < S; s++) {
            memcpy(&hash[(s * n_new + q) * B], &r->probe_hash[(s * NP + from) * B],
                   (size_t)B * sizeof *hash);
        }
    }
    free(r->probe_names);
    free(r->probe_hash);
    r->probe_names = names;
    r->probe_hash = hash;
    r->n_probes = n_new;
    return 0;
}

/* One more prompt column, a pad on the left of every row. */
static int craft_prompt_len(KvRun *r) {
    const int64_t B = r->batch, P = r->prompt_len;
    int32_t *prompt = calloc((size_t)(B * (P + 1)), sizeof *prompt);
    uint8_t *real = calloc((size_t)(B * (P + 1)), 1);
    if (prompt == NULL || real == NULL) {
        free(prompt);
        free(real);
        return -1;
    }
    for (int64_t b = 0; b < B; b++) {
        memcpy(&prompt[b * (P + 1) + 1], &r->prompt[b * P], (size_t)P * sizeof *prompt);
        memcpy(&real[b * (P + 1) + 1], &r->prompt_real[b * P], (size_t)P);
    }
    free(r->prompt);
    free(r->prompt_real);
    r->prompt = prompt;
    r->prompt_real = real;
    r->prompt_len = P + 1;
    return 0;
}

static int craft_run(KvRun *r, CraftEdit e) {
    const int64_t NP = r->n_probes;
    int64_t *map = calloc((size_t)NP + 2, sizeof *map);
    int rc = 0;
    if (map == NULL) return -1;
    switch (e) {
    case CRAFT_EXTEND:
        for (int64_t q = 0, p = 0; q < NP + 1; q++) map[q] = q == CRAFT_PROBE_INSERT ? -1 : p++;
        rc = craft_probes(r, NP + 1, map, "layer0.pre", 0); /* agrees where embed does */
        break;
    case CRAFT_EXTEND_TAIL:
        for (int64_t q = 0; q < NP; q++) map[q] = q;
        map[NP] = -1;
        rc = craft_probes(r, NP + 1, map, "extra", NP - 1);
        break;
    case CRAFT_SHRINK:
        for (int64_t q = 0; q < NP - 1; q++) map[q] = q < CRAFT_PROBE_INSERT ? q : q + 1;
        rc = craft_probes(r, NP - 1, map, "", 0);
        break;
    case CRAFT_SHRINK_TAIL:
        for (int64_t q = 0; q < NP - 1; q++) map[q] = q;
        rc = craft_probes(r, NP - 1, map, "", 0);
        break;
    case CRAFT_RENAME:
        snprintf(r->probe_names[CRAFT_PROBE_RENAME], KV_NAME_LEN, "layer0.kv");
        break;
    case CRAFT_SLASH:
        snprintf(r->probe_names[CRAFT_PROBE_RENAME], KV_NAME_LEN, "layer0/cache");
        break;
    case CRAFT_DUP:
        memcpy(r->probe_names[CRAFT_PROBE_RENAME + 1], r->probe_names[CRAFT_PROBE_RENAME],
               KV_NAME_LEN);
        break;
    case CRAFT_PROMPT_VOCAB:
        r->prompt[r->batch * r->prompt_len - 1] = (int32_t)r->vocab + 7;
        break;
    case CRAFT_TOKEN_VOCAB:
        r->tokens[0] = (int32_t)r->vocab;
        break;
    case CRAFT_VOCAB:
        rc = craft_vocab(r);
        break;
    case CRAFT_STEPS:
        r->steps -= 1; /* every per-step array is step-major: the prefix is written */
        break;
    case CRAFT_PROMPT_LEN:
        rc = craft_prompt_len(r);
        break;
    case CRAFT_MODEL:
        snprintf(r->model, KV_NAME_LEN, "%s",
                 strcmp(r->model, "mistral-tiny") == 0 ? "gemma2-tiny" : "mistral-tiny");
        break;
    case CRAFT_MODEL_HASH: case CRAFT_WEIGHT_SEED:
        break;
    }
    free(map);
    return rc;
}

static int craft_all(const char *gate, const char *dir) {
    const size_t n_cases = sizeof k_cases / sizeof k_cases[0];
    for (size_t c = 0; c < n_cases; c++) {
        KvReport rep;
        KvError err = {{0}};
        if (kv_report_read_h5(gate, &rep, &err) != KV_OK) {
            fprintf(stderr, "bisect_craft: %s\n", err.msg);
            return 2;
        }
        if (rep.n_runs < 2 || rep.runs[0].skipped || rep.runs[1].skipped ||
            rep.runs[1].n_probes <= CRAFT_PROBE_RENAME + 1 || rep.runs[1].steps < 2) {
            fprintf(stderr, "bisect_craft: %s: expected two unskipped runs with >= 2 steps and "
                    "the forward's probes, found %lld runs\n", gate, (long long)rep.n_runs);
            kv_report_free(&rep);
            return 2;
        }
        const CraftCase *k = &k_cases[c];
        if (k->edit == CRAFT_MODEL_HASH) rep.model_hash ^= 0x1;
        if (k->edit == CRAFT_WEIGHT_SEED) rep.weight_seed += 1;
        int rc = 0;
        for (int64_t i = 0; i < rep.n_runs && rc == 0; i++) {
            if (rep.runs[i].skipped || (k->scope == CRAFT_RUN1 && i != 1)) continue;
            rc = craft_run(&rep.runs[i], k->edit);
        }
        if (rc == 0 && k->edit == CRAFT_EXTEND_TAIL) {
            KvRun *r0 = &rep.runs[0], *r1 = &rep.runs[1];
            const int64_t NP = r1->n_probes, B = r1->batch;
            for (int64_t st = 0; st < r1->steps && r0->steps == r1->steps; st++) {
                memcpy(&r1->probe_hash[st * NP * B], &r0->probe_hash[st * NP * B],
                       (size_t)((NP - 1) * B) * sizeof *r1->probe_hash);
            }
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.h5", dir, k->name);
        KvStatus st = rc == 0 ? kv_report_write_h5(&rep, path, &err) : KV_ERR_INTERNAL;
        kv_report_free(&rep);
        if (st != KV_OK) {
            fprintf(stderr, "bisect_craft: %s: %s\n", path, rc == 0 ? err.msg : "cannot edit");
            return 2;
        }
        printf("%s\n", path);
    }
    return 0;
}

/* Run b's hashes at step s made run a's for probes 0..last (every row); with
 * `token`, its token and logits hash at s too. */
static void craft_copy_step(const KvRun *a, KvRun *b, int64_t s, int64_t last, bool token) {
    const int64_t NP = b->n_probes, B = b->batch;
    memcpy(&b->probe_hash[s * NP * B], &a->probe_hash[s * NP * B],
           (size_t)((last + 1) * B) * sizeof *b->probe_hash);
    if (!token) return;
    memcpy(&b->tokens[s * B], &a->tokens[s * B], (size_t)B * sizeof *b->tokens);
    if (a->logits_hash != NULL && b->logits_hash != NULL) {
        memcpy(&b->logits_hash[s * B], &a->logits_hash[s * B], (size_t)B * sizeof *b->logits_hash);
    }
}

/* Whether runs a and b differ in probe p at step s (any row). */
static bool craft_differs(const KvRun *a, const KvRun *b, int64_t s, int64_t p) {
    const int64_t NP = a->n_probes, B = a->batch;
    return memcmp(&a->probe_hash[(s * NP + p) * B], &b->probe_hash[(s * NP + p) * B],
                  (size_t)B * sizeof *a->probe_hash) != 0;
}

static int craft_hide(const char *gate, const char *dir) {
    static const char *const k_names[2] = {"hide_probe", "hide_step"};
    for (int k = 0; k < 2; k++) {
        KvReport rep;
        KvError err = {{0}};
        if (kv_report_read_h5(gate, &rep, &err) != KV_OK) {
            fprintf(stderr, "bisect_craft: %s\n", err.msg);
            return 2;
        }
        const KvRun *a = &rep.runs[0];
        KvRun *b = rep.n_runs >= 2 ? &rep.runs[1] : NULL;
        const bool usable = b != NULL && !a->skipped && !b->skipped && a->n_probes > 3 &&
                            a->n_probes == b->n_probes && a->steps == b->steps &&
                            a->batch == b->batch && a->probe_hash != NULL &&
                            b->probe_hash != NULL;
        int64_t s0 = -1, p0 = -1;
        for (int64_t s = 0; usable && s < a->steps && s0 < 0; s++) {
            for (int64_t p = 0; p < a->n_probes && s0 < 0; p++) {
                if (craft_differs(a, b, s, p)) {
                    s0 = s;
                    p0 = p;
                }
            }
        }
        const int64_t NP = usable ? a->n_probes : 0, fnorm = NP - 2;
        const int64_t s_named = s0 + k; /* where the edited hashes name final_norm */
        if (s0 < 0 || p0 >= fnorm || s_named >= a->steps || !craft_differs(a, b, s_named, fnorm)) {
            fprintf(stderr, "bisect_craft: %s: expected runs 0 and 1 to first differ before "
                    "final_norm at a step s with a differing final_norm at step s + %d, found "
                    "step %lld probe %lld\n", gate, k, (long long)s0, (long long)p0);
            kv_report_free(&rep);
            return 2;
        }
        if (k == 1) craft_copy_step(a, b, s0, NP - 1, true);
        craft_copy_step(a, b, s_named, fnorm - 1, false);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.h5", dir, k_names[k]);
        const KvStatus st = kv_report_write_h5(&rep, path, &err);
        kv_report_free(&rep);
        if (st != KV_OK) {
            fprintf(stderr, "bisect_craft: %s: %s\n", path, err.msg);
            return 2;
        }
        if (k == 0) printf("first %lld %lld\n", (long long)s0, (long long)p0);
    }
    return 0;
}

/* The string attribute `name` of object obj in file f, into out. */
static int craft_read_attr(hid_t f, const char *obj, const char *name, char *out, size_t n) {
    hid_t a = H5Aopen_by_name(f, obj, name, H5P_DEFAULT, H5P_DEFAULT);
    hid_t t = H5Tcopy(H5T_C_S1);
    int rc = -1;
    memset(out, 0, n);
    /* HDF5 converts between string sizes but not character sets. */
    if (a >= 0 && t >= 0 && H5Tset_size(t, n - 1) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
        H5Aread(a, t, out) >= 0) {
        rc = 0;
    }
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return rc;
}

static int craft_names(const char *gate, const char *out) {
    const float a[2] = {1.0f, 2.0f}, b[2] = {1.0f, 3.0f};
    /* The diverged probe's name has a '/', its two inputs share a name. */
    const KvBisectTensorOut t[3] = {
        {4, "layer0/cache", "diverged", 1, 2, 2, a, b},
        {2, "layer0.k", "input", 1, 2, 2, a, a},
        {3, "layer0.k", "input", 1, 2, 2, a, a},
    };
    const KvBisectRecord rec = {"x.h5:runs/0000 a", "x.h5:runs/0001 b", 0, 0, 4, "layer0/cache",
                                t, 3, 0, 0, 4, "layer0/cache"};
    KvError err = {{0}};
    if (kv_bisect_write_h5(gate, out, &rec, &err) != KV_OK) {
        fprintf(stderr, "bisect_craft: names: %s\n", err.msg);
        return 1;
    }
    int fails = 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        fprintf(stderr, "bisect_craft: names: %s: cannot open\n", out);
        return 1;
    }
    static const char *const groups[3] = {"/bisect/probe_0004", "/bisect/probe_0002",
                                          "/bisect/probe_0003"};
    for (int i = 0; i < 3; i++) {
        char name[KV_NAME_LEN];
        if (craft_read_attr(f, groups[i], "name", name, sizeof name) != 0 ||
            strcmp(name, t[i].name) != 0) {
            fprintf(stderr, "bisect_craft: names: %s: %s: expected attribute name '%s', found "
                    "'%s'\n", out, groups[i], t[i].name, name);
            fails++;
        }
    }
    char pname[KV_NAME_LEN];
    if (craft_read_attr(f, "/bisect", "probe_name", pname, sizeof pname) != 0 ||
        strcmp(pname, "layer0/cache") != 0) {
        fprintf(stderr, "bisect_craft: names: %s: /bisect: expected probe_name 'layer0/cache', "
                "found '%s'\n", out, pname);
        fails++;
    }
    H5Fclose(f);

    /* Two dumps of one probe would need one group twice: refused. */
    const KvBisectTensorOut twice[2] = {t[1], t[1]};
    const KvBisectRecord rec2 = {"a", "b", 0, 0, 2, "layer0.k", twice, 2, 0, 0, 2, "layer0.k"};
    const KvStatus st = kv_bisect_write_h5(gate, out, &rec2, &err);
    if (st != KV_ERR_INPUT || strstr(err.msg, "probe 2") == NULL) {
        fprintf(stderr, "bisect_craft: names: one probe dumped twice: expected KV_ERR_INPUT "
                "naming probe 2, found %d (%s)\n", (int)st, err.msg);
        fails++;
    }
    if (fails == 0) printf("names: /bisect/probe_NNNN with name attributes: ok\n");
    return fails == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "craft") == 0) return craft_all(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "hide") == 0) return craft_hide(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "names") == 0) return craft_names(argv[2], argv[3]);
    fprintf(stderr, "usage: bisect_craft craft GATE.h5 OUTDIR | hide GATE.h5 OUTDIR | "
            "names GATE.h5 OUT.h5\n");
    return 2;
}
