# bisect_layout.cmake: `kvrepro bisect` on reports that do not match each
# other or the model. Crafted from a real gate report by bisect_craft (probe
# layouts extended, shrunk, renamed, with a '/' or a repeated name; token ids
# outside the vocabulary; other shapes, models, model hashes, weight seeds),
# each must be refused with exit 2 and a message naming the report, the run
# and the first mismatch, before anything is indexed: never a crash (the
# sanitized run makes out-of-bounds reads fatal) and never a "does NOT
# reproduce". Also: the /bisect group of a good rerun is named by probe
# index, is the same bytes when written twice, and takes names holding '/'
# or repeats. Run by ctest with -DKVREPRO, -DCRAFT and -DWORK.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)

# kv_refused(CASE REGEX args...): bisect on ${WORK}/CASE.h5 with args exits 2,
# says REGEX on stderr, refuses before locating anything (no recorded index
# used) and never blames the runs for a report mismatch.
function(kv_refused case regex)
  kv_run(2 out err ${KVREPRO} bisect "${WORK}/${case}.h5" ${ARGN})
  kv_expect_match("${err}" "/${case}\\.h5[: ]" "${case} ${ARGN}: names the report")
  kv_expect_match("${err}" "${regex}" "${case} ${ARGN}")
  kv_expect_no_match("${out}" "first divergence|does NOT reproduce|nondeterministic"
                     "${case} ${ARGN}")
endfunction()

# The real report: reference vs ring with a window off by one, which first
# differ at layer0.attn (probe 5 of 31) at step 0: a divergence to index.
set(R "${WORK}/R.h5")
kv_run(1 out err ${KVREPRO} gate --quiet --no-goldens --fixture gemma2-tiny --scenarios prompt_w_plus_1
       --variants ring --backends cpu --modes eager --fault window_off_by_one --repeats 1
       --no-calibrate --report "${R}")

# A good rerun: /bisect/probe_NNNN named by index, the name an attribute;
# written twice, across a clock second, the same bytes (no timestamps).
kv_run(1 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/ok1.h5")
kv_expect_match("${out}" "probe layer0.attn \\(probe 5 of 31" "the real report bisects")
kv_expect_match("${out}" "A reproduces its recorded hash there, B reproduces" "rerun reproduces")
execute_process(COMMAND h5dump -A -g /bisect "${WORK}/ok1.h5" RESULT_VARIABLE dump_rc
                OUTPUT_VARIABLE dump ERROR_QUIET)
if(NOT dump_rc EQUAL 0)
  message(FATAL_ERROR "ok1.h5: h5dump -g /bisect failed (rc ${dump_rc})")
endif()
foreach(g probe_0005 probe_0001 probe_0004)
  kv_expect_match("${dump}" "GROUP \"${g}\"" "/bisect/${g}")
endforeach()
execute_process(COMMAND h5dump -a /bisect/probe_0005/name "${WORK}/ok1.h5" OUTPUT_VARIABLE dump
                ERROR_QUIET)
kv_expect_match("${dump}" "\\(0\\): \"layer0.attn\"" "/bisect/probe_0005 name attribute")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1)
kv_run(1 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/ok2.h5")
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORK}/ok1.h5" "${WORK}/ok2.h5"
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "two identical reruns wrote different /bisect bytes")
endif()
kv_run(0 out err ${KVREPRO} show "${WORK}/ok1.h5")
kv_run(0 out err ${CRAFT} names "${R}" "${WORK}/names.h5")

kv_run(0 out err ${CRAFT} craft "${R}" "${WORK}")

# Every run edited alike: the runs agree with each other, so plain bisect
# still works from the hashes (a layer is named only for the forward's own
# layout); --rerun checks them against the model and refuses.
set(MODEL "the report does not match this model")
kv_refused(extended "runs/0000 records 32 probes, gemma2-tiny has 31 \\(probe 1: recorded 'layer0.pre', model 'layer0.q'\\); ${MODEL}" --rerun)
kv_refused(extended_tail "records 32 probes, gemma2-tiny has 31 \\(probe 31: recorded 'extra', model \\(none\\)\\)" --rerun)
kv_refused(shrunk "runs/0000 records 30 probes, gemma2-tiny has 31 \\(probe 1: recorded 'layer0.k', model 'layer0.q'\\); ${MODEL}" --rerun)
kv_refused(shrunk_tail "records 30 probes, gemma2-tiny has 31 \\(probe 30: recorded \\(none\\), model 'logits'\\)" --rerun)
kv_refused(renamed "records 31 probes, gemma2-tiny has 31 \\(probe 4: recorded 'layer0.kv', model 'layer0.cache'\\)" --rerun)
kv_refused(slash "\\(probe 4: recorded 'layer0/cache', model 'layer0.cache'\\)" --rerun)
kv_refused(dup "\\(probe 5: recorded 'layer0.cache', model 'layer0.attn'\\)" --rerun)
kv_refused(prompt_vocab "prompt\\[row 0, position [0-9]+\\]: expected a token id in \\[0, 512\\), the vocabulary of gemma2-tiny, found 519; ${MODEL}" --rerun)
kv_refused(vocab "runs/0000: vocab 513, gemma2-tiny has 512; ${MODEL}" --rerun)
kv_refused(model_hash "model_hash 0x[0-9a-f]+ recorded for gemma2-tiny, gemma2-tiny \\(weight seed 20261122\\) has 0x[0-9a-f]+; ${MODEL}" --rerun)
kv_refused(weight_seed "recorded for gemma2-tiny, gemma2-tiny \\(weight seed 20261123\\) has" --rerun)
kv_refused(shrunk "records 30 probes" --run 0 --run 1 --rerun)

kv_run(1 out err ${KVREPRO} bisect "${WORK}/extended.h5")
kv_expect_match("${out}" "row 0, probe layer0.attn \\(probe 6 of 32" "plain bisect, extended layout")
kv_run(1 out err ${KVREPRO} bisect "${WORK}/extended_tail.h5")
kv_expect_match("${out}" "step 0, row 0, probe extra \\(probe 31 of 32" "plain bisect, a probe past the model's")
kv_run(1 out err ${KVREPRO} bisect "${WORK}/dup.h5")
kv_expect_match("${out}" "step 0, row 0, probe layer0.cache \\(probe 5 of 31" "plain bisect, repeat: no layer")
kv_run(1 out err ${KVREPRO} bisect "${WORK}/slash.h5")
kv_expect_match("${out}" "row 0, probe layer0.attn \\(probe 5 of 31" "plain bisect, slash")

# Run 1 edited alone: the runs disagree with each other, so plain bisect
# (the first failing comparison, or named runs) refuses too.
set(PAIR "runs/0000 and [^ ]*pair_[a-z]+\\.h5: runs/0001 cannot be compared")
foreach(args "" "--rerun" "--run;0;--run;1")
  kv_refused(pair_extended "${PAIR}: the probe layouts differ \\(31 vs 32 probes; probe 1: 'layer0.q' vs 'layer0.pre'\\)" ${args})
  kv_refused(pair_shrunk "${PAIR}: the probe layouts differ \\(31 vs 30 probes; probe 1: 'layer0.q' vs 'layer0.k'\\)" ${args})
  kv_refused(pair_renamed "${PAIR}: the probe layouts differ \\(31 vs 31 probes; probe 4: 'layer0.cache' vs 'layer0.kv'\\)" ${args})
  kv_refused(pair_slash "probe 4: 'layer0.cache' vs 'layer0/cache'\\)" ${args})
  kv_refused(pair_dup "probe 5: 'layer0.attn' vs 'layer0.cache'\\)" ${args})
endforeach()
kv_refused(pair_token "runs/0001: tokens\\[step 0, row 0\\]: expected a token id in \\[0, 512\\), the vocabulary of the run, found 512")
kv_refused(pair_vocab "${PAIR}: vocab 512 vs 513")
kv_refused(pair_steps "${PAIR}: steps ([0-9]+) vs ([0-9]+)")
kv_refused(pair_prompt "${PAIR}: prompt_len ([0-9]+) vs ([0-9]+)")
kv_refused(pair_model "${PAIR}: model 'gemma2-tiny' vs 'mistral-tiny'")

# Two reports: the runs must be of one model.
kv_run(2 out err ${KVREPRO} bisect "${R}" "${WORK}/model_hash.h5" --run 1 --run 1)
kv_expect_match("${err}" "R\\.h5 and [^ ]*model_hash\\.h5 record gemma2-tiny with different model hashes"
                "two reports, model hashes")
kv_run(2 out err ${KVREPRO} bisect "${R}" "${WORK}/weight_seed.h5" --run 1 --run 1)
kv_expect_match("${err}" "record fixture gemma2-tiny with different weights \\(weight seed 20261122 vs 20261123\\)"
                "two reports, weight seeds")
kv_run(2 out err ${KVREPRO} bisect "${R}" "${WORK}/pair_shrunk.h5" --run 1 --run 1 --rerun)
kv_expect_match("${err}" "R\\.h5: runs/0001 and [^ ]*pair_shrunk\\.h5: runs/0001 cannot be compared: the probe layouts differ"
                "two reports, layouts")
