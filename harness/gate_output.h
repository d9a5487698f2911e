/* gate_output.h: what every gate does with its report, whether it ran the
 * matrix (cmd_gate.c) or judged another engine's runs (gate_external.c):
 * the root attributes, the failure lines, the output files. Part of the
 * kvrepro command layer (it stamps the tool's version and commit). */
#ifndef KV_GATE_OUTPUT_H
#define KV_GATE_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "report.h"
#include "status.h"

/* Fills the report's root attributes but the device and the model hash
 * (DESIGN §8): tool version and commit, host, math mode, the seeds as
 * given, and the shard "I/N". */
void kv_gate_fill_root(KvReport *rep, uint64_t weight_seed, uint64_t prompt_seed, int shard_i,
                       int shard_n);

/* Before anything runs: an output path (either may be NULL) that cannot be
 * written fails now (KV_ERR_INPUT), not after an hour of decoding. */
KvStatus kv_gate_check_outputs(const char *report_path, const char *junit_path, KvError *err);

/* Before anything runs: --report and --junit may not name one file (two
 * writers, one survivor), nor a file the gate reads: one of `inputs`
 * (n_inputs paths: the prompts file, --external files), or a checkpoint
 * file (*.json, *.safetensors) in one of `model_dirs`. Files are compared
 * by identity (device and inode, links followed), paths that do not exist
 * yet by their resolved directory and name. KV_ERR_INPUT naming both. */
KvStatus kv_gate_check_outputs_apart(const char *report_path, const char *junit_path,
                                     const char *const *inputs, int n_inputs,
                                     const char *const *model_dirs, int n_dirs, KvError *err);

/* Writes the HDF5 report and the JUnit XML where their paths are not NULL,
 * saying where unless quiet ("report: PATH", "junit: PATH"). A gate calls
 * it before printing its count line, so that a log ending in that line
 * means the files are complete; a failure is KV_ERR_INPUT naming the path
 * (exit 2), with the previous file at the path untouched. The runs'
 * seconds (wall times the gate measured) go to JUnit's time attributes;
 * the HDF5 report gets them only when timings (--timings), 0 otherwise,
 * so that the same gate writes the same report bytes (docs/SCHEMA.md).
 * gate_fail: why the gate fails beyond its runs (it judged too little), or
 * NULL: JUnit then carries it as one more failed test case
 * (kv_junit_write_verdict), so it never reads all green where the console
 * ends in FAIL.
 * KV_ERR_INTERNAL when out of memory. */
KvStatus kv_gate_write_outputs(const KvReport *rep, const char *report_path,
                               const char *junit_path, bool timings, bool quiet,
                               const char *gate_fail, KvError *err);

#endif
