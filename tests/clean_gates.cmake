# clean_gates.cmake: the long false-alarm check (DESIGN §7, label "long", not
# part of `make test`; run it with `make long-check`). Runs the default gate
# N times in fresh processes, alternating OMP_NUM_THREADS between 1 and 2,
# and reports how many clean gates failed (false alarms) and whether every
# report is byte-identical to the first. Any false alarm or differing byte
# fails the check.
#   cmake -DKVREPRO=path/to/kvrepro -DWORK=dir -DN=100 -P clean_gates.cmake
if(NOT DEFINED N)
  set(N 100)
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(alarms 0)
set(differ 0)
foreach(i RANGE 1 ${N})
  math(EXPR threads "1 + ${i} % 2")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=${threads}
                  ${KVREPRO} gate --quiet --report "${WORK}/gate.h5"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 1)
    math(EXPR alarms "${alarms} + 1")
    message(STATUS "gate ${i}: FALSE ALARM\n${out}")
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "gate ${i}: exit ${rc}: ${err}")
  endif()
  if(i EQUAL 1)
    file(RENAME "${WORK}/gate.h5" "${WORK}/first.h5")
  else()
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${WORK}/first.h5" "${WORK}/gate.h5"
                    RESULT_VARIABLE same)
    if(NOT same EQUAL 0)
      math(EXPR differ "${differ} + 1")
      message(STATUS "gate ${i}: report differs from the first")
    endif()
  endif()
endforeach()
message(STATUS "clean gates: ${N}, false alarms: ${alarms}, reports differing from the first: ${differ}")
if(alarms GREATER 0 OR differ GREATER 0)
  message(FATAL_ERROR "clean gates are not all silent and identical")
endif()
