/* fuzz_h5fix.h: recomputing the metadata checksums of an HDF5 file after a
 * mutation, for fuzz_report's custom mutator.
 *
 * Reports use the v1.8 format objects (SCHEMA.md): a version-2 superblock
 * and version-2 object headers with continuation chunks, each protected by
 * a Jenkins lookup3 checksum. A random byte change in any of them is then
 * rejected by the checksum before anything is parsed, so without this the
 * fuzzer only ever reaches raw data and the checksum error path. Structures
 * without a checksum in these files (v1 B-trees of chunked datasets, raw
 * data) need nothing. */
#ifndef KV_FUZZ_H5FIX_H
#define KV_FUZZ_H5FIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Rewrites, in place, the checksum of the superblock at offset 0, of every
 * object header found by its signature, and of every continuation chunk an
 * object header names, to match their current bytes. Anything that does not
 * parse as such a structure is left alone; never reads or writes outside
 * data[0, size). */
void kv_fuzz_h5_fix_checksums(uint8_t *data, size_t size);

#endif
