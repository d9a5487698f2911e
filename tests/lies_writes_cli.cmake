# lies_writes_cli.cmake: writes go only where they were named, end to end:
# `bisect --rerun --out` never follows a link at
# OUT, refuses an OUT that exists and is not a regular file, removes the
# temporaries killed bisects left; a damaged /bisect group is exit 2 naming
# it (no libhdf5 dump); `merge` refuses shard labels that are no shard of a
# split and a FIFO as OUT; `fixture` refuses a FIFO in DIR, and a fixture
# that fails removes the directory it made. Run by ctest with -DKVREPRO,
# -DCRAFT (writes_craft) and -DWORK.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)

function(kv_expect_file_content path want what)
  file(READ "${path}" got)
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "${what}: ${path} changed: '${got}'")
  endif()
endfunction()

function(kv_expect_fifo path what)
  execute_process(COMMAND test -p "${path}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: ${path} is no longer a FIFO")
  endif()
endfunction()

# A failing gate report: reference vs ring with a window off by one.
set(R "${WORK}/R.h5")
kv_run(1 out err ${KVREPRO} gate --quiet --no-goldens --fixture gemma2-tiny --scenarios prompt_w_plus_1
       --variants ring --backends cpu --modes eager --fault window_off_by_one --repeats 1
       --no-calibrate --report "${R}")

# OUT a symbolic link: replaced itself (a regular file with the dumps), its
# target untouched.
file(WRITE "${WORK}/victim.txt" "victim")
file(CREATE_LINK "${WORK}/victim.txt" "${WORK}/link.h5" SYMBOLIC)
kv_run(1 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/link.h5")
kv_expect_file_content("${WORK}/victim.txt" "victim" "bisect --out LINK")
if(IS_SYMLINK "${WORK}/link.h5")
  message(FATAL_ERROR "bisect --out LINK: ${WORK}/link.h5 is still a link")
endif()
kv_run(0 out err ${KVREPRO} show "${WORK}/link.h5")

# A link planted at the temporary's name ("OUT.tmp-PID": the shell's pid is
# the one kvrepro keeps through exec): its target untouched, OUT a regular
# file, the link gone.
file(WRITE "${WORK}/victim2.txt" "victim2")
kv_run(1 out err sh -c "ln -s '${WORK}/victim2.txt' '${WORK}/planted.h5.tmp-'$$ && exec \"$@\"" sh
       ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/planted.h5")
kv_expect_file_content("${WORK}/victim2.txt" "victim2" "bisect, a link at OUT.tmp-PID")
if(IS_SYMLINK "${WORK}/planted.h5")
  message(FATAL_ERROR "bisect, a link at OUT.tmp-PID: ${WORK}/planted.h5 is a link")
endif()
file(GLOB left "${WORK}/planted.h5.tmp-*")
if(left)
  message(FATAL_ERROR "bisect, a link at OUT.tmp-PID: left ${left}")
endif()
kv_run(0 out err ${KVREPRO} show "${WORK}/planted.h5")

# OUT a FIFO (as /dev/full or /dev/null would be, as root): exit 2 naming it,
# before the rerun, and the FIFO stays a FIFO.
execute_process(COMMAND mkfifo "${WORK}/fifo.h5" "${WORK}/merged_fifo.h5" RESULT_VARIABLE mkfifo_rc)
if(NOT mkfifo_rc EQUAL 0)
  message(FATAL_ERROR "mkfifo failed (${mkfifo_rc})")
endif()
kv_run(2 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/fifo.h5")
kv_expect_match("${err}" "fifo\\.h5: cannot create: expected a regular file or a new name, found a FIFO"
                "bisect --out FIFO")
kv_expect_no_match("${out}" "rerun to step" "bisect --out FIFO: refused before the rerun")
kv_expect_fifo("${WORK}/fifo.h5" "bisect --out FIFO")
kv_run(2 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}")
kv_expect_match("${err}" "cannot create: Is a directory" "bisect --out DIR")

# Temporaries of killed bisects ("OUT.tmp-PID" of a process that no longer
# exists) are removed by the next bisect to OUT; one of a live process (this
# test's cmake) is kept.
execute_process(COMMAND sh -c "echo $$" OUTPUT_VARIABLE dead OUTPUT_STRIP_TRAILING_WHITESPACE)
execute_process(COMMAND sh -c "echo $PPID" OUTPUT_VARIABLE live OUTPUT_STRIP_TRAILING_WHITESPACE)
file(WRITE "${WORK}/out.h5.tmp-${dead}" "left by a killed bisect")
file(WRITE "${WORK}/out.h5.tmp-${live}" "a live writer's")
kv_run(1 out err ${KVREPRO} bisect "${R}" --rerun --out "${WORK}/out.h5")
if(EXISTS "${WORK}/out.h5.tmp-${dead}")
  message(FATAL_ERROR "bisect --out: the dead writer's ${WORK}/out.h5.tmp-${dead} was not removed")
endif()
if(NOT EXISTS "${WORK}/out.h5.tmp-${live}")
  message(FATAL_ERROR "bisect --out: a live writer's ${WORK}/out.h5.tmp-${live} was removed")
endif()
file(REMOVE "${WORK}/out.h5.tmp-${live}")
file(GLOB left "${WORK}/*.tmp-*")
if(left)
  message(FATAL_ERROR "bisect left ${left}")
endif()

# A damaged /bisect group (a dataset's header overwritten): exit 2 naming
# the object, before the rerun; no "infinite loop closing library" dump;
# the report untouched.
kv_run(0 out err ${CRAFT} damage "${WORK}/out.h5" "${WORK}/damaged.h5")
file(SHA256 "${WORK}/damaged.h5" before)
kv_run(2 out err ${KVREPRO} bisect "${WORK}/damaged.h5" --rerun)
kv_expect_match("${err}" "damaged\\.h5: /bisect: expected a group that bisect --rerun can replace, found a damaged one: /bisect/probe_[0-9]+/[ab]: "
                "damaged /bisect")
kv_expect_no_match("${err}" "infinite loop|HDF5-DIAG" "damaged /bisect: no libhdf5 dump")
kv_expect_no_match("${out}" "rerun to step" "damaged /bisect: refused before the rerun")
file(SHA256 "${WORK}/damaged.h5" after)
if(NOT before STREQUAL after)
  message(FATAL_ERROR "damaged /bisect: the report changed")
endif()
kv_run(2 out err ${KVREPRO} bisect "${WORK}/damaged.h5" --rerun --out "${WORK}/from_damaged.h5")
if(EXISTS "${WORK}/from_damaged.h5")
  message(FATAL_ERROR "damaged /bisect: --out was written")
endif()
# A good /bisect is replaced (bisect over its own output, in place).
kv_run(1 out err ${KVREPRO} bisect "${WORK}/out.h5" --rerun)
kv_expect_match("${out}" "dumps: [^\n]*out\\.h5 /bisect" "bisect over its own output")
kv_run(0 out err ${KVREPRO} show "${WORK}/out.h5")

# merge: shard labels that are no shard of a split, and a FIFO as OUT.
kv_run(0 out err ${KVREPRO} gate --quiet --no-goldens --fixture gemma2-tiny --scenarios prompt_w_plus_1
       --variants ring --backends cpu --modes eager --repeats 1 --no-calibrate --shard 1/2
       --report "${WORK}/s1.h5")
foreach(label "x" "0/0" "3/2" "1/0" "01/2" "1/2x" "-1/2" "merged 0" "merged")
  string(MAKE_C_IDENTIFIER "bad_${label}" name)
  kv_run(0 out err ${CRAFT} shard "${WORK}/s1.h5" "${WORK}/${name}.h5" "${label}")
  kv_run(2 out err ${KVREPRO} merge "${WORK}/m_${name}.h5" "${WORK}/s1.h5" "${WORK}/${name}.h5")
  kv_expect_match("${err}" "${name}\\.h5: shard: expected I/N with 1 <= I <= N" "merge shard '${label}'")
  kv_run(2 out err ${KVREPRO} merge "${WORK}/m_${name}.h5" "${WORK}/${name}.h5")
  if(EXISTS "${WORK}/m_${name}.h5")
    message(FATAL_ERROR "merge shard '${label}': ${WORK}/m_${name}.h5 was written")
  endif()
endforeach()
kv_run(0 out err ${KVREPRO} merge "${WORK}/m_ok.h5" "${WORK}/s1.h5")
kv_run(0 out err ${KVREPRO} merge "${WORK}/m_ok2.h5" "${WORK}/m_ok.h5")
kv_run(2 out err ${KVREPRO} merge "${WORK}/merged_fifo.h5" "${WORK}/s1.h5")
kv_expect_match("${err}" "merged_fifo\\.h5: cannot create: expected a regular file or a new name, found a FIFO"
                "merge OUT FIFO")
kv_expect_fifo("${WORK}/merged_fifo.h5" "merge OUT FIFO")

# fixture: a FIFO at DIR/model.safetensors is refused and stays; a fixture
# that fails (a full disk: `ulimit -f`, SIGXFSZ ignored) removes the
# directory it made, and nothing is left in a directory that was there.
file(MAKE_DIRECTORY "${WORK}/fx")
execute_process(COMMAND mkfifo "${WORK}/fx/model.safetensors")
kv_run(2 out err ${KVREPRO} fixture --family gemma2 --out "${WORK}/fx")
kv_expect_match("${err}" "fx/model\\.safetensors: cannot create: expected a regular file or a new name, found a FIFO"
                "fixture FIFO")
kv_expect_fifo("${WORK}/fx/model.safetensors" "fixture FIFO")
if(EXISTS "${WORK}/fx/config.json")
  message(FATAL_ERROR "fixture FIFO: config.json was written")
endif()
kv_run(2 out err sh -c "ulimit -f 1000 && trap '' XFSZ && exec \"$@\"" sh
       ${KVREPRO} fixture --family gemma2 --out "${WORK}/fx_new")
kv_expect_match("${err}" "fx_new/model\\.safetensors: cannot write: File too large" "fixture full disk")
if(EXISTS "${WORK}/fx_new")
  message(FATAL_ERROR "fixture on a full disk left the directory it made, ${WORK}/fx_new")
endif()
file(MAKE_DIRECTORY "${WORK}/fx_old")
kv_run(2 out err sh -c "ulimit -f 1000 && trap '' XFSZ && exec \"$@\"" sh
       ${KVREPRO} fixture --family gemma2 --out "${WORK}/fx_old")
file(GLOB left "${WORK}/fx_old/*" "${WORK}/fx_old/.*")
if(left OR NOT IS_DIRECTORY "${WORK}/fx_old")
  message(FATAL_ERROR "fixture on a full disk in an existing directory: left '${left}'")
endif()
