# cli_helpers.cmake: the helpers the end-to-end CMake test scripts share
# (cli_test.cmake, bisect_layout.cmake, bisect_walkback.cmake).

# kv_run(EXPECT_RC OUT_VAR ERR_VAR args...)
function(kv_run expect out_var err_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "${expect}")
    message(FATAL_ERROR "expected exit ${expect}, got ${rc}: ${ARGN}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

function(kv_expect_match text regex what)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: expected to match '${regex}', got:\n${text}")
  endif()
endfunction()

function(kv_expect_no_match text regex what)
  if(text MATCHES "${regex}")
    message(FATAL_ERROR "${what}: expected no match for '${regex}', got:\n${text}")
  endif()
endfunction()
