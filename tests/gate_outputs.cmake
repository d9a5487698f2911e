# gate_outputs.cmake: the matrix gate's verdict comes after its files
# (`gate --external` is checked in test_external.c). Run by ctest
# with -DKVREPRO and -DWORK.
#   - With --report and --junit: the grid, "report: R", "junit: J", then
#     "N passed, N failed, N skipped" as the last line; --quiet prints only
#     that line, after writing.
#   - A report or JUnit file that cannot be written once the runs are judged
#     (a full disk: `ulimit -f` with SIGXFSZ ignored, so write() fails with
#     EFBIG the way ENOSPC makes it fail) exits 2 naming the path, prints no
#     count line, and leaves the previous file byte for byte and no
#     temporary beside it.
#   - --summary-md and --summary-json: the verdict for a CI job summary and
#     for scripts, written before the count line, with the console's counts,
#     the failing unit and its bisect command; the same path twice, or one
#     that cannot be created, exits 2 before any decode.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)

set(SMALL --fixture mistral-tiny --scenarios prompt_w --variants ring --repeats 1
    --backends cpu --modes eager)

# The output ends in the count line, and each of ARGN (a whole line) comes
# before it.
function(expect_count_line_last out what)
  string(REGEX MATCH "[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped\n$" last "${out}")
  if(last STREQUAL "")
    message(FATAL_ERROR "${what}: expected the output to end in the count line, got:\n${out}")
  endif()
  string(LENGTH "${out}" n_out)
  string(LENGTH "${last}" n_last)
  math(EXPR at "${n_out} - ${n_last}")
  foreach(line IN LISTS ARGN)
    string(FIND "${out}" "\n${line}\n" pos)
    if(pos LESS 0 OR pos GREATER_EQUAL at)
      message(FATAL_ERROR "${what}: expected '${line}' before the count line, got:\n${out}")
    endif()
  endforeach()
endfunction()

kv_run(0 out err ${KVREPRO} gate ${SMALL} --report "${WORK}/r.h5" --junit "${WORK}/r.xml")
expect_count_line_last("${out}" "gate with --report and --junit"
                       "report: ${WORK}/r.h5" "junit: ${WORK}/r.xml")
kv_expect_match("${out}" "\n\\(runs passed/failed/skipped per model and scenario" "the grid before the files")
kv_run(0 out err ${KVREPRO} gate ${SMALL} --quiet --report "${WORK}/q.h5")
kv_expect_match("${out}" "^[0-9]+ passed, 0 failed, [0-9]+ skipped\n$"
                "--quiet: the count line only")

# A full disk once the runs are judged. `ulimit -f 1` is 512 bytes in dash
# and 1024 in bash; the small gate's report and JUnit file are larger.
foreach(kind report junit)
  if(kind STREQUAL "report")
    set(path "${WORK}/r.h5")
  else()
    set(path "${WORK}/r.xml")
  endif()
  file(SIZE "${path}" size)
  if(size LESS_EQUAL 1024)
    message(FATAL_ERROR "${path}: ${size} bytes fit under the limit; the test cannot fail")
  endif()
  file(READ "${path}" before HEX)
  kv_run(2 out err sh -c "ulimit -f 1 && trap '' XFSZ && exec \"$@\"" sh
         ${KVREPRO} gate ${SMALL} --${kind} "${path}")
  kv_expect_match("${err}" "kvrepro gate: ${path}: cannot write: File too large"
                  "--${kind} on a full disk names the path")
  if(out MATCHES "passed, ")
    message(FATAL_ERROR "--${kind} on a full disk: a count line was printed for a gate whose "
            "file was not written:\n${out}")
  endif()
  kv_expect_match("${out}" "\n\\(runs passed/failed/skipped per model and scenario"
                  "--${kind} on a full disk: the verdict is printed")
  file(READ "${path}" after HEX)
  if(NOT before STREQUAL after)
    message(FATAL_ERROR "--${kind} on a full disk changed ${path}")
  endif()
  file(GLOB left "${WORK}/*.tmp-*")
  if(left)
    message(FATAL_ERROR "--${kind} on a full disk left ${left}")
  endif()
endforeach()

# The summaries: a passing gate, then a failing one.
kv_run(0 out err ${KVREPRO} gate ${SMALL} --summary-md "${WORK}/s.md"
       --summary-json "${WORK}/s.json")
expect_count_line_last("${out}" "gate with summaries" "summary: ${WORK}/s.md"
                       "summary: ${WORK}/s.json")
string(REGEX MATCH "([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped\n$" counts "${out}")
set(np ${CMAKE_MATCH_1})
set(ns ${CMAKE_MATCH_3})
file(READ "${WORK}/s.md" md)
kv_expect_match("${md}" "^## kvrepro gate: PASS\n\n${np} passed, 0 failed, ${ns} skipped \\(runs\\)\n\n```text\n(transformers goldens [^\n]*\n)?scenario "
                "--summary-md: the verdict, the counts, the grid")
file(READ "${WORK}/s.json" js)
string(JSON fmt GET "${js}" format)
string(JSON verdict GET "${js}" verdict)
string(JSON jp GET "${js}" passed)
string(JSON js_skipped GET "${js}" skipped)
string(JSON n_fail LENGTH "${js}" failures)
if(NOT fmt STREQUAL "kvrepro-summary" OR NOT verdict STREQUAL "pass" OR NOT jp EQUAL np
   OR NOT js_skipped EQUAL ns OR NOT n_fail EQUAL 0)
  message(FATAL_ERROR "--summary-json of a passing gate: ${js}")
endif()
kv_run(1 out err ${KVREPRO} gate --fixture mistral-tiny --scenarios prompt_w_plus_1 --variants ring
       --repeats 1 --backends cpu --fault stale_scalar --report "${WORK}/f.h5"
       --summary-md "${WORK}/f.md" --summary-json "${WORK}/f.json")
file(READ "${WORK}/f.md" md)
kv_expect_match("${md}" "^## kvrepro gate: FAIL\n" "--summary-md of a failing gate")
kv_expect_match("${md}" "\n     next: kvrepro bisect ${WORK}/f.h5 --run mistral-tiny/prompt_w_plus_1/"
                "--summary-md: the bisect command")
file(READ "${WORK}/f.json" js)
string(JSON verdict GET "${js}" verdict)
string(JSON next GET "${js}" failures 0 next)
string(JSON n_cells LENGTH "${js}" grid)
set(cell_failed 0)
math(EXPR last "${n_cells} - 1")
foreach(c RANGE ${last})
  string(JSON f GET "${js}" grid ${c} failed)
  math(EXPR cell_failed "${cell_failed} + ${f}")
endforeach()
if(NOT verdict STREQUAL "fail" OR NOT next MATCHES "^kvrepro bisect ${WORK}/f.h5 --run "
   OR cell_failed EQUAL 0)
  message(FATAL_ERROR "--summary-json of a failing gate: ${js}")
endif()
# refused before any decode
kv_run(2 out err ${KVREPRO} gate ${SMALL} --summary-md "${WORK}/x.h5" --report "${WORK}/x.h5")
kv_expect_match("${err}" "--summary-md ${WORK}/x.h5 and --report ${WORK}/x.h5 name the same file"
                "a summary over the report")
kv_run(2 out err ${KVREPRO} gate ${SMALL} --summary-json "${WORK}/no/such/s.json")
kv_expect_match("${err}" "no/such/s.json: cannot create" "an unwritable summary")
if(out MATCHES "passed, " OR EXISTS "${WORK}/x.h5")
  message(FATAL_ERROR "a refused summary path still ran the gate:\n${out}")
endif()

