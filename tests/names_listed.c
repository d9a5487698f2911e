/* names_listed.c: prints every name of every registry a user sees a list
 * of, one "LIST NAME" line each, read straight from the registries (not
 * through the CLI's own list code, harness/cli.c kv_cli_names, which is
 * what is checked): names_listed.cmake then finds each one in the help
 * texts and the "expected ..." messages (names listed once). */
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "cache.h"
#include "cache_registry.h"
#include "config.h"
#include "fault.h"
#include "fixture.h"
#include "junit.h"
#include "scenario.h"

int main(void) {
    int n = 0;
    const KvCacheOps *const *variants = kv_cache_all(&n);
    for (int k = 0; k < n; k++) printf("variant %s\n", variants[k]->name);
    /* the lane's names --variants takes for a variant's layout */
    const KvCacheAlias *aliases = kv_cache_aliases(&n);
    for (int k = 0; k < n; k++) printf("variant_alias %s\n", aliases[k].alias);
    const KvFixtureInfo *fixtures = kv_fixture_all(&n);
    for (int k = 0; k < n; k++) {
        printf("fixture %s\n", fixtures[k].name);
        /* a family is listed by the model_type its config.json holds */
        printf("model_type %s\n", kv_family_name(fixtures[k].family));
    }
    /* --family takes each family's model_type, and the short form the
     * fixtures' names use where that differs */
    const KvFixtureWord *words = kv_fixture_families(&n);
    for (int k = 0; k < n; k++) {
        const char *type = kv_family_name((KvFamily)words[k].value);
        printf("fixture_family %s\n", type);
        if (strcmp(type, words[k].word) != 0) printf("family_alias %s\n", words[k].word);
    }
    words = kv_fixture_sizes(&n);
    for (int k = 0; k < n; k++) printf("fixture_size %s\n", words[k].word);
    const char *const *scenarios = kv_scenario_all_names(&n);
    for (int k = 0; k < n; k++) printf("scenario %s\n", scenarios[k]);
    const KvFaultInfo *faults = kv_fault_all(&n);
    for (int k = 0; k < n; k++) printf("fault %s\n", faults[k].name);
    const KvBackendOps *const *backends = kv_backend_all(&n);
    for (int k = 0; k < n; k++) printf("backend %s\n", backends[k]->name);
    for (int k = 0; k <= (int)KV_CMP_LAST; k++) {
        printf("kind %s\n", kv_compare_kind_name((KvCompareKind)k));
    }
    return 0;
}
