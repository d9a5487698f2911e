/* mutation.h: the mutation score (DESIGN §7). `kvrepro gate --faults LIST`
 * runs the gate matrix once clean and once per planted fault into one
 * report; each pass's comparisons are accounted here: a fault is caught
 * when any comparison of its pass failed, and every failure of the clean
 * pass is a false alarm. */
#ifndef KV_MUTATION_H
#define KV_MUTATION_H

#include <stdint.h>
#include <stdio.h>

#include "report.h"
#include "status.h"

typedef struct {
    unsigned faults;        /* the pass's planted fault bits (fault.h); 0 = the clean pass */
    int64_t comparisons;    /* comparisons made in this pass */
    int64_t failed;         /* of which failed */
    unsigned kinds_failed;  /* bit (1 << KvCompareKind) for each kind that failed */
    int64_t first_fail;     /* index into the report's comparisons of the first failure, -1 */
} KvMutationPass;

/* Adds the report's comparisons [from, to) to pass p. */
void kv_mutation_account(KvMutationPass *p, const KvReport *rep, int64_t from, int64_t to);

/* Faults caught among passes[1..n) (passes[0] is the clean pass). */
int kv_mutation_caught(const KvMutationPass *passes, int n);

/* Prints one line per fault (caught or not, by which comparison kinds, the
 * first divergence), then "mutation score: C/P" and "false alarms: N (of M
 * clean comparisons)". KV_ERR_INTERNAL when writing to f fails. */
KvStatus kv_mutation_print(const KvMutationPass *passes, int n, const KvReport *rep, FILE *f);

#endif
