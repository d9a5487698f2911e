/* forward.h: the reference forward pass over a full-length cache.
 *
 * The reference keeps every position of every layer (slot = absolute
 * position, max_len slots) and applies the window as a mask (DESIGN §2):
 * this is the "obviously right" layout every cache variant is compared with.
 * Batches are left-padded: each sequence has the same number of slots; pad
 * slots are never visible as keys, and a token's RoPE position is the number
 * of real tokens before it in its sequence. A sequence may also end a
 * forward in trailing pads (right padding, DESIGN §2, when the state allows
 * it): such a pad is static-shape filler that takes no slot and no
 * position, so sequences then sit at different positions.
 *
 * The forward is a list of ops launched on a stream (stream.h), so the same
 * list runs eagerly or is captured and replayed. Everything else plugs in
 * from outside through KvRefHooks (as ggml's eval callback): an observer
 * called after each named intermediate, a replacement for the matmul, the
 * key order and the mask window, and a replacement for a layer's cache
 * store and attention (engine/ puts cache variants there). With no hooks
 * it is the plain reference. */
#ifndef KV_FORWARD_H
#define KV_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "state.h"

/* Checks n new tokens (B, n) against the vocabulary, the padding rule and
 * the state's capacity without touching the state. */
KvStatus kv_ref_check_input(const KvRefState *s, const int32_t *tokens, const uint8_t *real,
                            int64_t n, KvError *err);

/* Launches one forward of the n tokens already in tok_in/real_in on
 * s->stream: positions, embedding, layers, final norm + lm_head + softcap,
 * argmax into tok_in[0..B) (the next step's input) and total_mem += n. On an
 * eager stream it runs now; while capturing it is recorded. The caller
 * advances s->len (the host count) by n afterwards. */
void kv_ref_launch_forward(KvRefState *s, int64_t n);

/* The forward's tail for one hidden row x (hidden) after the last layer:
 * the final norm into last (hidden) and the lm_head and final softcap into
 * logits (vocab), as a forward whose last token that row was computes them
 * (a prefill cut from a longer one, stream_tape.h). */
void kv_ref_final_row(const KvRefState *s, const float *x, float *last, float *logits);

/* Appends n tokens to every sequence, runs the model now and copies the
 * logits (B, vocab) of each sequence's last new token. tokens, real: (B, n). */
KvStatus kv_ref_forward(KvRefState *s, const int32_t *tokens, const uint8_t *real, int64_t n,
                        float *logits, KvError *err);

/* The positions op's work: gives each of the n new tokens its slot and RoPE
 * position from total_mem and the sequence's counts. pads_take_slots makes
 * trailing pads take slots as left pads do (a static-shape loop's bug). */
void kv_ref_place_tokens(KvRefState *s, int64_t n, bool pads_take_slots);

#endif
