/* report.h: the in-memory form of a gate run (DESIGN §6, §8): what the
 * harness records and compares, what the HDF5 writer stores (docs/SCHEMA.md) and
 * what the reader gives back. Plain data: every array is owned by its struct
 * and released by kv_report_free. */
#ifndef KV_REPORT_H
#define KV_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

#define KV_REPORT_SCHEMA_VERSION 1
#define KV_NAME_LEN 64

/* The longest row text a run keeps (KvRun.prompt_text), in bytes. */
#define KV_PROMPT_TEXT_MAX_BYTES ((size_t)1 << 16)

/* A copy of texts ((n) strings) as a KvRun.prompt_text array (n + 1
 * entries, a NULL after the last); NULL when out of memory. */
char **kv_prompt_text_copy(char *const *texts, int64_t n);

/* Whether text is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
bool kv_utf8_valid(const char *text);

/* text as one line for a log: each run of whitespace (a line break, a tab)
 * one space, at most max_chars characters (UTF-8 sequences kept whole),
 * "..." after a cut; into out (n bytes, NUL-terminated). */
void kv_text_snippet(const char *text, int max_chars, char *out, size_t n);

/* Frees a KvRun.prompt_text array (NULL: nothing). */
void kv_prompt_text_free(char **texts);

/* Length of KvRun.engine. */
#define KV_ENGINE_LEN 256

/* One recorded decode. Identified by (model, scenario, variant, backend,
 * mode, repeat); the reference run has variant "reference", mode "eager",
 * repeat 0. Create runs with kv_run_init: the optional fields below whose
 * "unset" value is not 0 (recompiles, graph_budget) are written to a report
 * only when set, so a zeroed run would record values it never had. */
typedef struct {
    char model[KV_NAME_LEN];     /* fixture name or model directory basename */
    char scenario[KV_NAME_LEN];
    char variant[KV_NAME_LEN];   /* "reference", a cache variant name, or (a run of another
                                  * engine, `gate --external`) that engine's own name */
    char fault[KV_NAME_LEN];     /* planted fault(s) of this run (fault.h names), "" = clean */
    char backend[16];            /* "cpu" or "cuda"; another engine's, e.g. "torch-cuda" */
    char mode[16];               /* "eager" or "graph"; another engine's, e.g. "compile" */
    /* Written by another engine (docs/SCHEMA.md), optional: what produced
     * the run, e.g. "transformers 5.23.0, torch 2.15.0, attn sdpa, fp32"
     * ("" = unset); dynamo recompiles during the decode phase, and the most
     * decode graphs its capturing layer is designed to need (-1 = unset;
     * graphs_captured then counts the graphs dynamo compiled for the decode). */
    char engine[KV_ENGINE_LEN];
    int64_t recompiles;
    int64_t graph_budget;
    /* Written by kvrepro-hf capture (docs/SCHEMA.md), optional ("" / 0 =
     * unset, and then not written): what `gate --external` copies from the
     * recording into its report, for the plots and the recompile reason. */
    char attn_impl[32];          /* "eager", "sdpa", "flex_attention" */
    char dtype[16];              /* "fp32", "bf16" */
    char cache_layer[KV_NAME_LEN]; /* e.g. "static_sliding" */
    int64_t window;              /* the sliding window W the run decoded with */
    char probes_seen[256];       /* a compiled run: which probes it records */
    char first_recompile[1024];  /* a compiled run: dynamo's first guard failure */
    /* A run of a prompts file with texts (docs/SCHEMA.md; NULL / "" = none,
     * and then not written): each row's text and the tokenizer that made
     * its ids, "<name> vocab=<V> sha256=<first 16 hex of the vocab hash>". */
    char **prompt_text;          /* (batch + 1) NUL-terminated UTF-8, a NULL after the last */
    char tokenizer[256];
    int32_t repeat;              /* 0 .. repeats-1 */
    bool skipped;                /* not run here (e.g. no CUDA device) */
    char skip_reason[256];
    int64_t steps, batch, vocab;
    int64_t prompt_len;
    int64_t prefill_chunk;       /* tokens per prefill forward, 0 = the whole prompt at once */
    /* A prefix-reuse run (DESIGN §5; 0 / NULL otherwise, and then not
     * written): the prefill saved a prefix-cache entry after column
     * save_after, and step switch_step restored it and fed the suffix. */
    int64_t save_after;
    int64_t switch_step;
    int64_t suffix_len;
    int32_t *suffix;             /* (batch, suffix_len) or NULL */
    /* A context-shift run (DESIGN §5; 0 otherwise, and then not written):
     * before step shift_step's forward, positions shift_keep .. shift_keep
     * + shift_drop - 1 were dropped and the later ones moved down. */
    int64_t shift_step;
    int64_t shift_keep;
    int64_t shift_drop;
    int32_t *prompt;             /* (batch, prompt_len) left-padded ids */
    uint8_t *prompt_real;        /* (batch, prompt_len) */
    int32_t *tokens;             /* (steps, batch) greedy token per step */
    float *logits;               /* (steps, batch, vocab); NULL when topk > 0 */
    int32_t topk;                /* 0: full logits; k > 0: only each row's k largest are kept
                                  * (vocabularies above the gate's --full-logits-max-vocab) */
    int32_t *topk_ids;           /* (steps, batch, topk) by descending logit, ties to lowest id */
    float *topk_values;          /* (steps, batch, topk) */
    uint64_t *logits_hash;       /* (steps, batch) FNV-1a 64 of each row's logits bytes */
    float *margins;              /* (steps, batch) top-1 minus runner-up */
    int64_t n_probes;
    char (*probe_names)[KV_NAME_LEN]; /* (n_probes) e.g. "embed", "layer2.q", "logits" */
    uint64_t *probe_hash;        /* (steps, n_probes, batch) FNV-1a 64 per probe row */
    /* Optional (NULL = not recorded; written only when set): on a calibrated
     * reference run, step s's max over rows of the relative logit error
     * against the fp64 shadow (shadow64.h), the yardstick the unit's
     * tolerance is built from (DESIGN §6). */
    double *fp64_rel_err;        /* (steps) or NULL */
    int64_t graphs_captured;
    int64_t replays_checked;
    int64_t replay_mismatch_step; /* -1 when none */
    double seconds;              /* wall time of the decode (not part of any comparison) */
    /* In memory only (the "finite" comparison records the finding): the
     * first non-finite probe value the decode saw, when the backend checks
     * its probes (nonfinite_checked); step/probe/row/index -1 when none. */
    bool nonfinite_checked;
    int64_t nonfinite_step, nonfinite_probe, nonfinite_row, nonfinite_index;
    float nonfinite_value;
} KvRun;

/* The real (non-pad) prompt tokens of row b of run r. */
int64_t kv_run_row_ids(const KvRun *r, int64_t b);

typedef enum { KV_VERDICT_PASS = 0, KV_VERDICT_FAIL = 1, KV_VERDICT_SKIP = 2 } KvVerdict;

/* Comparison kinds (DESIGN §6). */
typedef enum {
    KV_CMP_REFERENCE = 0, /* candidate vs reference: tolerance + tie-aware tokens */
    KV_CMP_REPEAT = 1,    /* repeat k vs repeat 0: bitwise */
    KV_CMP_GRAPH = 2,     /* graph vs eager: bitwise */
    KV_CMP_VARIANT = 3,   /* variant vs variant on one backend: bitwise */
    KV_CMP_REPLAY = 4,    /* replays of one step from one snapshot: bitwise */
    KV_CMP_FINITE = 5,    /* one run's logits and probes hold no NaN or Inf (a = b) */
    KV_CMP_COMPILED = 6,  /* another engine's compiled mode vs its eager mode: tolerance +
                           * tie-aware tokens (compiled code may reorder float math) */
    KV_CMP_GRAPH_BUDGET = 7, /* one run (a = b): decode graphs captured within its budget */
    KV_CMP_FRESH = 8,     /* a reused state vs a fresh run of the same context: bitwise */
    KV_CMP_SHIFT = 9,     /* a context-shifted state vs a fresh run of the shifted context:
                           * the shift's tolerance + tie-aware tokens (RoPE re-applied to
                           * stored keys is not RoPE recomputed) */
    KV_CMP_GOLDEN = 10,   /* transformers' committed decode (a) vs the CPU reference fed its
                           * tokens (b): the golden tolerances + tie-aware tokens; judges the
                           * reference itself, which every candidate shares */
    KV_CMP_SHADOW = 11,   /* the reference run (a = b) within KV_FP64_MAX_REL_ERR of its own
                           * fp64 shadow (shadow64.h): judges the reference itself */
    KV_CMP_ROW_ALONE = 12, /* each row of a golden's left-padded batch (b, the reference)
                            * vs the same prompt decoded alone: bitwise (padding only shifts
                            * slots; RoPE is relative, so only this sees a reference whose
                            * positions count the pads) */
} KvCompareKind;
#define KV_CMP_LAST KV_CMP_ROW_ALONE

typedef struct {
    KvCompareKind kind;
    int64_t run_a, run_b;        /* indices into KvReport.runs (b = candidate) */
    KvVerdict verdict;
    char message[512];           /* one line: what differed where, or why skipped */
    /* first divergence, -1 when none */
    int64_t first_step, first_row, first_probe;
    int64_t near_ties;           /* reference comparison: flips under the tie threshold */
    double max_abs_err, max_rel_err, nmse, kl, top1_agreement; /* reference comparison */
} KvComparison;

typedef struct {
    char name[KV_NAME_LEN];
    double value;
    char reason[160];
} KvTolerance;

typedef struct {
    /* root attributes */
    char tool_version[64];
    char git_commit[64];
    char host[128];
    char device[256];            /* "cpu only" or the CUDA device, driver, CUDA, cuBLAS */
    char math_mode[64];          /* e.g. "fp32, no TF32, -ffp-contract=off" */
    uint64_t weight_seed;        /* the gate's fixture weight seed (--seed), stored as given;
                                  * it determines fixture models only, a model directory's
                                  * weights are its own (model_hash identifies them) */
    uint64_t prompt_seed;
    uint64_t model_hash;         /* kv_model_hash of the (first) model */
    char shard[32];              /* "1/1" or "I/N" */
    KvTolerance *tolerances;     /* (n_tolerances) */
    int64_t n_tolerances;
    KvRun *runs;                 /* (n_runs) */
    int64_t n_runs;
    KvComparison *comparisons;   /* (n_comparisons) */
    int64_t n_comparisons;
} KvReport;

/* The run's variant as every listing shows it: "variant", or
 * "variant+fault" for a run with a planted fault (NUL-terminated, truncated
 * to n). */
void kv_run_variant_label(const KvRun *r, char *out, size_t n);

/* A run with nothing in it: every field zero except the ones whose "none"
 * is -1 (replay_mismatch_step, recompiles, graph_budget). NULL is allowed. */
void kv_run_init(KvRun *r);

/* Frees every array a run owns and zeroes the struct (so it can be freed
 * again or refilled; refill it through kv_run_init). NULL is allowed. */
void kv_run_free(KvRun *r);
/* Frees every run (kv_run_free), the tolerances and the comparisons, and
 * zeroes the struct. NULL and an all-zero report are allowed. */
void kv_report_free(KvReport *rep);

/* The verdict of run i as `kvrepro show` and the gate print it: FAIL when any
 * comparison with run_b == i failed (a failure outranks a skip, as in the
 * JUnit output); otherwise SKIP when the run was skipped or any such
 * comparison was skipped; otherwise PASS (so a reference run, which is never
 * a run_b, passes when it ran). i out of range gives SKIP. */
KvVerdict kv_report_run_verdict(const KvReport *rep, int64_t i);

/* The largest max_rel_err over reference comparisons with run_b == i; NaN
 * when there is none (e.g. the reference run). */
double kv_report_run_max_rel_err(const KvReport *rep, int64_t i);

/* One line saying where run i first diverged, written to buf (always
 * NUL-terminated, truncated to n): for the first failing comparison with
 * run_b == i, "step S row R [probe NAME] vs LABEL" (LABEL is run_a's
 * variant/backend/mode/rN) when it has a position, else its message; for a
 * run without a failure "skipped: <reason>" when skipped, the first skipped
 * comparison's message when one was skipped, else "-". */
void kv_report_run_divergence(const KvReport *rep, int64_t i, char *buf, size_t n);

/* Prints exactly "N passed, N failed, N skipped" counting runs by
 * kv_report_run_verdict. KV_ERR_INTERNAL when writing to f fails. */
KvStatus kv_report_print_counts(const KvReport *rep, FILE *f);

/* What the three calls above say about one run, for every run at once:
 * kv_report_summarize_runs makes one pass over the comparisons, where
 * calling kv_report_run_verdict etc. for every run is a pass per run
 * (quadratic in the report's size, minutes for a large or crafted one). */
typedef struct {
    KvVerdict verdict;     /* kv_report_run_verdict */
    double max_rel_err;    /* kv_report_run_max_rel_err (NaN when none) */
    int64_t n_comparisons; /* comparisons with run_b == this run */
    int64_t n_reference;   /* of them, reference comparisons (the ones with an error) */
    int64_t first_fail;    /* index of the first such failing comparison, -1 when none */
    int64_t first_skip;    /* index of the first such skipped comparison, -1 when none */
} KvRunSummary;

/* Sets *out to a malloc'd array of rep->n_runs summaries (free() it; NULL
 * when there are no runs). Comparisons whose run_b is out of range are
 * ignored, as the per-run calls ignore them. KV_OK, KV_ERR_INPUT for NULL
 * arguments, KV_ERR_INTERNAL when out of memory. */
KvStatus kv_report_summarize_runs(const KvReport *rep, KvRunSummary **out);

/* kv_report_run_divergence from run i's summary s (from
 * kv_report_summarize_runs), without a pass over the comparisons. */
void kv_report_run_divergence_of(const KvReport *rep, int64_t i, const KvRunSummary *s, char *buf,
                                 size_t n);

/* Prints the summary table: a header line, one line per run (index, model,
 * scenario, variant, backend, mode, repeat, verdict, first divergence, max
 * rel err, graphs) with columns as wide as their widest entry, then exactly
 * "N passed, N failed, N skipped" counting runs by kv_report_run_verdict.
 * Linear in runs + comparisons. Returns KV_OK, or KV_ERR_INTERNAL when out
 * of memory or writing to f fails. */
KvStatus kv_report_print_summary(const KvReport *rep, FILE *f);
/* The same table without the rows of skipped runs on the n_fold backends
 * named in fold (a backend the caller already reported as unable to run,
 * in one line); the counts still count every run. */
KvStatus kv_report_print_summary_folded(const KvReport *rep, const char *const *fold, int n_fold,
                                        FILE *f);
/* kv_report_print_summary_folded without the count line: the header and
 * the rows only, for a caller that prints the count line later (the gate
 * prints it once its output files are written). */
KvStatus kv_report_print_table_folded(const KvReport *rep, const char *const *fold, int n_fold,
                                      FILE *f);

/* ---- report files ----------------------------------------------------------
 * Shared by the HDF5 writer (report_h5_write.c) and the JUnit writer (junit.c). */

/* Checks, before a long run, that path can be written later: path is not a
 * directory or another file that is not a regular file (a device, a FIFO;
 * a symbolic link is replaced, as rename replaces it) nor named like a
 * writer's temporary (kv_report_is_temp_name), its directory exists,
 * and a file can be created there (an unnamed temporary, or where the file
 * system has none a "<path>.tmp-<pid>" that is removed at once). Nothing is
 * left behind, unless that removal fails ("<path>: cannot remove <tmp>:
 * <reason>"; the next write removes it). KV_OK, or KV_ERR_INPUT "<path>:
 * cannot create: <reason>". A full disk is not foreseen here: it is
 * reported by the write itself. */
KvStatus kv_report_check_writable(const char *path, KvError *err);

/* Writes len bytes to path so that path is either untouched or complete,
 * and no temporary outlives the call, even when the process is killed:
 *   - the bytes go to an unnamed file in path's directory (O_TMPFILE), are
 *     fsync'ed, then linked as "<path>.tmp-<pid>" and renamed over path
 *     (the name exists only between the link and the rename);
 *   - where the file system has no unnamed files, to "<path>.tmp-<pid>"
 *     directly, then fsync and rename; a failure removes it;
 *   - first, "<path>.tmp-<pid>" files of processes that no longer exist
 *     (left by a killed writer, this one's older versions included) are
 *     removed.
 * Returns KV_OK; KV_ERR_INPUT for a NULL or empty path, a path that cannot
 * be created ("<path>: cannot create: <reason>") or written ("<path>: cannot
 * write: <reason>", a full disk or a quota included): every failure of the
 * destination is bad input, never an internal error. */
KvStatus kv_report_file_publish(const char *path, const void *data, size_t len, KvError *err);

/* kv_report_file_publish for bytes that are produced while they are
 * written (a file too large to hold, a file built elsewhere): fill(fd, ctx)
 * writes the whole file to fd (opened for writing at offset 0) and returns
 * 0, or -1 with errno set (ENOSPC, EFBIG, ...: "<path>: cannot write:
 * <reason>"). fill may be called twice, the second time on a fresh file,
 * where the unnamed temporary cannot be given a name (no /proc and no
 * CAP_DAC_READ_SEARCH), so it must write the same bytes each time. Every
 * other guarantee, and the errors, are kv_report_file_publish's. */
KvStatus kv_report_file_publish_with(const char *path, int (*fill)(int fd, void *ctx), void *ctx,
                                     KvError *err);

/* True when path's last component looks like a writer's temporary,
 * "NAME.tmp-DIGITS": readers refuse such files. */
bool kv_report_is_temp_name(const char *path);

#endif
