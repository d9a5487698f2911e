/* script.h: the scripted decodes of DESIGN §5 (prefix reuse after the
 * window wrapped, speculative rollback past it, a context shift) as
 * drivers over the backend table. The engine's decode driver knows no
 * scenario: it calls a script (decode.h KvDecodeScript) at fixed points,
 * and what a request switch or a shift does is written here. */
#ifndef KV_SCRIPT_H
#define KV_SCRIPT_H

#include <stdint.h>

#include "decode.h"
#include "model.h"
#include "scenario.h"
#include "status.h"

typedef struct {
    /* Prefix reuse (0 / NULL: none): the prefill saves a prefix-cache
     * entry (snapshot slot KV_SNAP_PREFIX) after its first save_after
     * columns; at decode step switch_step (1 <= switch_step < new_tokens)
     * the entry is restored and the suffix, (B, suffix_len) real tokens, is
     * fed as one eager forward whose last token's logits are that step's.
     * A speculative rollback is the same with the entry saved late. */
    int64_t save_after;
    int64_t switch_step;
    int64_t suffix_len;
    const int32_t *suffix; /* (B, suffix_len) */
    /* Context shift (0: none): before decode step shift_step's forward
     * (none when the decode stops first) the backend drops positions
     * shift_keep .. shift_keep + shift_drop - 1 and moves the later ones
     * down (backend.h shift). Not with a request switch or right padding. */
    int64_t shift_step;
    int64_t shift_keep;
    int64_t shift_drop;
    /* what the decode calls, filled by kv_script_bind */
    KvDecodeScript hooks;
    int64_t batch;
    int64_t new_tokens;
} KvScript;

/* A scenario's script: its switch and its shift (unbound). */
KvScript kv_script_of_scenario(const KvScenario *sc);

/* Checks the spec (kv_decode_check_spec) and then s against it and the
 * model, with the messages a bad script gets (KV_ERR_INPUT), and sets
 * spec->script to s when s scripts anything, else to NULL. s must stay
 * where it is until the decode is done. */
KvStatus kv_script_bind(KvScript *s, const KvModel *m, KvDecodeSpec *spec, KvError *err);

/* kv_script_bind, then kv_decode_run on ops (NULL: the CPU backend);
 * *out is zeroed first, so it may be freed whatever the outcome. */
KvStatus kv_script_decode(const KvBackendOps *ops, KvScript *s, const KvModel *m,
                          KvDecodeSpec *spec, KvDecodeResult *out, KvBackendStats *stats,
                          KvError *err);

#endif
