/* mutation.c: accounting and printing the mutation score (mutation.h). */
#include "mutation.h"

#include <inttypes.h>
#include <string.h>

#include "compare.h"
#include "fault.h"
#include "junit.h"

/* Whether comparison i pairs two runs of one backend. */
static int mutation_same_backend(const KvReport *rep, int64_t i) {
    const KvComparison *c = &rep->comparisons[i];
    return strcmp(rep->runs[c->run_a].backend, rep->runs[c->run_b].backend) == 0;
}

void kv_mutation_account(KvMutationPass *p, const KvReport *rep, int64_t from, int64_t to) {
    for (int64_t i = from; i < to && i < rep->n_comparisons; i++) {
        const KvComparison *c = &rep->comparisons[i];
        p->comparisons++;
        if (c->verdict != KV_VERDICT_FAIL) continue;
        p->failed++;
        p->kinds_failed |= 1u << (unsigned)c->kind;
        /* The first failure names the divergence, but a failure between two
         * backends (a CUDA candidate against the CPU reference) has its first
         * bitwise difference at step 0's first probe, where the GEMMs round
         * differently, wherever the fault acts: seen on the first GPU run.
         * The first same-backend failure, when there is one, places it. */
        if (p->first_fail < 0 ||
            (!mutation_same_backend(rep, p->first_fail) && mutation_same_backend(rep, i))) {
            p->first_fail = i;
        }
    }
}

int kv_mutation_caught(const KvMutationPass *passes, int n) {
    int caught = 0;
    for (int i = 1; i < n; i++) caught += passes[i].failed > 0;
    return caught;
}

/* "MODEL SCENARIO step S row R probe P: B vs A" for comparison i, or its
 * message when it has no position. */
static void mutation_divergence(const KvReport *rep, int64_t i, char *out, size_t n) {
    const KvComparison *c = &rep->comparisons[i];
    const KvRun *a = &rep->runs[c->run_a];
    const KvRun *b = &rep->runs[c->run_b];
    char la[160], lb[160], where[128] = "";
    kv_run_label(a, la, sizeof la);
    kv_run_label(b, lb, sizeof lb);
    if (c->first_step >= 0) {
        char probe[KV_NAME_LEN + 8] = "";
        if (c->first_probe >= 0 && c->first_probe < b->n_probes && b->probe_names != NULL) {
            snprintf(probe, sizeof probe, " %.*s", KV_NAME_LEN, b->probe_names[c->first_probe]);
        }
        snprintf(where, sizeof where, "step %" PRId64 " row %" PRId64 "%s", c->first_step,
                 c->first_row, probe);
    } else {
        snprintf(where, sizeof where, "%.120s", c->message);
    }
    snprintf(out, n, "%.*s %.*s %s: %s vs %s", KV_NAME_LEN, b->model, KV_NAME_LEN, b->scenario,
             where, lb, la);
}

KvStatus kv_mutation_print(const KvMutationPass *passes, int n, const KvReport *rep, FILE *f) {
    fprintf(f, "%-20s %-6s %-44s %s\n", "fault", "caught", "by", "first divergence");
    for (int i = 1; i < n; i++) {
        const KvMutationPass *p = &passes[i];
        char name[128], by[160] = "", div[512] = "-";
        kv_fault_names(p->faults, name, sizeof name);
        for (unsigned k = 0; k < 8; k++) {
            if (!(p->kinds_failed & (1u << k))) continue;
            const size_t used = strlen(by);
            snprintf(by + used, sizeof by - used, "%s%s", used > 0 ? "," : "",
                     kv_compare_kind_name((KvCompareKind)k));
        }
        if (p->first_fail >= 0) mutation_divergence(rep, p->first_fail, div, sizeof div);
        fprintf(f, "%-20s %-6s %-44s %s\n", name, p->failed > 0 ? "yes" : "NO",
                by[0] != '\0' ? by : "-", div);
    }
    fprintf(f, "mutation score: %d/%d\n", kv_mutation_caught(passes, n), n - 1);
    fprintf(f, "false alarms: %" PRId64 " (of %" PRId64 " clean comparisons)\n",
            n > 0 ? passes[0].failed : 0, n > 0 ? passes[0].comparisons : 0);
    if (n > 0 && passes[0].first_fail >= 0) {
        char div[512];
        mutation_divergence(rep, passes[0].first_fail, div, sizeof div);
        fprintf(f, "first false alarm: %s\n", div);
    }
    if (fflush(f) != 0 || ferror(f)) return KV_ERR_INTERNAL;
    return KV_OK;
}
