# gate_outputs.cmake: the matrix gate's verdict comes after its files (issue
# 20, item 4; `gate --external` is checked in test_external.c). Run by ctest
# with -DKVREPRO and -DWORK.
#   - With --report and --junit: the table, "report: R", "junit: J", then
#     "N passed, N failed, N skipped" as the last line; --quiet prints only
#     that line, after writing.
#   - A report or JUnit file that cannot be written once the runs are judged
#     (a full disk: `ulimit -f` with SIGXFSZ ignored, so write() fails with
#     EFBIG the way ENOSPC makes it fail) exits 2 naming the path, prints no
#     count line, and leaves the previous file byte for byte and no
#     temporary beside it.
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
kv_expect_match("${out}" "\n *0  [^\n]* PASS " "the table before the files")
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
  kv_expect_match("${out}" "\n *0  [^\n]* PASS " "--${kind} on a full disk: the table is printed")
  file(READ "${path}" after HEX)
  if(NOT before STREQUAL after)
    message(FATAL_ERROR "--${kind} on a full disk changed ${path}")
  endif()
  file(GLOB left "${WORK}/*.tmp-*")
  if(left)
    message(FATAL_ERROR "--${kind} on a full disk left ${left}")
  endif()
endforeach()
