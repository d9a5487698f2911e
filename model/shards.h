/* shards.h: a sharded checkpoint: DIR/model.safetensors.index.json and the
 * safetensors files its weight_map names.
 *
 * The index is what transformers' save_pretrained writes for a large model:
 * {"metadata": {...}, "weight_map": {tensor name: shard file name}}. Every
 * shard named is opened and validated by kv_st_open exactly like a single
 * model.safetensors, and the map and the shards must agree tensor for
 * tensor: each mapped tensor in the shard the map names, each tensor of each
 * shard in the map, none in two shards. Anything else is KV_ERR_INPUT naming
 * the index or the shard and the tensor; nothing stays open on failure. */
#ifndef KV_SHARDS_H
#define KV_SHARDS_H

#include <stddef.h>

#include "safetensors.h"
#include "status.h"

/* The index's file name in a model directory (transformers'
 * SAFE_WEIGHTS_INDEX_NAME). */
#define KV_SHARDS_INDEX_NAME "model.safetensors.index.json"

/* An index lists every tensor once, about 100 bytes each: a few MB for the
 * largest public checkpoints (~100k tensors with per-expert weights). The
 * bound caps what reading it allocates. */
#define KV_SHARDS_MAX_INDEX_BYTES (64u * 1024u * 1024u)
/* Shard files: 191 for llama-3.1-405B, 163 for deepseek-v3; each stays
 * mapped while the model lives, so the count is bounded well below the
 * kernel's default map limit (65530). */
#define KV_SHARDS_MAX_FILES 4096

typedef struct {
    const KvTensorInfo *info; /* the tensor, in files[file]'s table */
    size_t file;
} KvShardEntry;

typedef struct {
    KvSafetensors *files; /* (n_files) the shards, sorted by file name; mappings kept alive */
    size_t n_files;
    KvShardEntry *map;    /* (n_map) the weight_map resolved, sorted by tensor name */
    size_t n_map;
    char label[512];      /* the index's path, used in messages */
} KvShards;

/* Reads the index at index_path (normally DIR/KV_SHARDS_INDEX_NAME) and
 * opens every shard it names, as DIR/<name>. A shard name must be a file
 * name inside DIR: one containing '/', or "." or "..", is refused before
 * anything is opened, so an index cannot reach outside its directory. On
 * failure *out is zeroed and nothing stays open or allocated. */
KvStatus kv_shards_open(const char *dir, const char *index_path, KvShards *out, KvError *err);

/* Releases the shards and the map (safe on a zeroed struct). */
void kv_shards_close(KvShards *s);

/* The tensor `name` in the shard the weight_map names for it (*file set to
 * that shard), or NULL when the map has no such entry. */
const KvTensorInfo *kv_shards_find(const KvShards *s, const char *name,
                                   const KvSafetensors **file);

#endif
