# run_fuzz.cmake: the ctest driver of the fuzz targets (tests/fuzz/README.md).
#
#   cmake -DMODE=build -DSRC=<repo>/tests/fuzz -DBIN=<build>/fuzz -P run_fuzz.cmake
#       configures tests/fuzz as its own project with clang into BIN and
#       builds it (ctest: fuzz_build, the setup fixture of the runs below).
#   cmake -DMODE=run -DFUZZ_TARGET=config|safetensors|report|report_edit -DSECONDS=N
#         -DSRC=... -DBIN=... -P run_fuzz.cmake
#       1. regression pass: every file of corpus/FUZZ_TARGET and regressions/FUZZ_TARGET,
#          once; a failure names the input;
#       2. a bounded fuzz run: libFuzzer with -seed=1 for N seconds from that
#          corpus (new inputs go to BIN/work/FUZZ_TARGET, never into the source
#          tree); a failure names the saved crashing input. The final line
#          gives executions, coverage (cov/ft) and corpus size, and is
#          written to BIN/stats/FUZZ_TARGET.txt.
# Either step failing fails the test (FATAL_ERROR).

cmake_minimum_required(VERSION 3.22)

if(NOT SRC OR NOT BIN OR NOT MODE)
  message(FATAL_ERROR "run_fuzz.cmake: needs -DMODE, -DSRC and -DBIN")
endif()

if(MODE STREQUAL "build")
  # clang 14 is Debian bookworm's; libFuzzer ships in libclang-rt-14-dev.
  find_program(KV_CLANG NAMES clang-14 clang HINTS /usr/lib/llvm-14/bin)
  if(NOT KV_CLANG)
    message(FATAL_ERROR "fuzz_build: no clang found; install the Debian packages clang-14 "
      "libclang-rt-14-dev llvm-14 (scripts/ensure-deps.sh does, as root)")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -DCMAKE_C_COMPILER=${KV_CLANG}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz_build: configuring ${SRC} with ${KV_CLANG} failed:\n${out}\n${err}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} --parallel 2
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz_build: building the fuzz targets failed:\n${out}\n${err}")
  endif()
  message(STATUS "fuzz_build: fuzz targets built in ${BIN} with ${KV_CLANG}")
  return()
endif()

if(NOT MODE STREQUAL "run" OR NOT FUZZ_TARGET OR NOT SECONDS)
  message(FATAL_ERROR "run_fuzz.cmake: MODE=run needs -DFUZZ_TARGET and -DSECONDS")
endif()

set(exe ${BIN}/fuzz_${FUZZ_TARGET})
if(NOT EXISTS ${exe})
  message(FATAL_ERROR "fuzz_${FUZZ_TARGET}: ${exe} is missing (did fuzz_build pass?)")
endif()

# Per-target settings. max_len covers the largest seed; the report target
# does not check leaks after each input (libhdf5 leaks on most damaged files,
# see lsan.supp; LeakSanitizer still runs at exit, with that suppression).
# report_edit writes only well-formed files: its leaks are all checked.
set(max_len_config 4096)
set(max_len_safetensors 8192)
set(max_len_report 32768)
set(max_len_report_edit 2048)
set(leaks_config 1)
set(leaks_safetensors 1)
set(leaks_report 0)
set(leaks_report_edit 1)
if(NOT DEFINED max_len_${FUZZ_TARGET})
  message(FATAL_ERROR "run_fuzz.cmake: unknown target '${FUZZ_TARGET}'")
endif()

# The scratch files of the loaders that take paths: under /dev/shm when it
# exists, one directory per build tree and target, removed afterwards.
string(MD5 tree_id "${BIN}")
string(SUBSTRING "${tree_id}" 0 12 tree_id)
if(IS_DIRECTORY /dev/shm)
  set(scratch /dev/shm/kvrepro-fuzz-${tree_id}-${FUZZ_TARGET})
else()
  set(scratch ${BIN}/scratch/${FUZZ_TARGET})
endif()
file(REMOVE_RECURSE ${scratch})
file(MAKE_DIRECTORY ${scratch})
set(ENV{KV_FUZZ_TMPDIR} ${scratch})

set(ENV{ASAN_OPTIONS} "detect_leaks=1:allocator_may_return_null=0:handle_abort=1")
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:halt_on_error=1")
if(FUZZ_TARGET STREQUAL "report")
  set(ENV{LSAN_OPTIONS} "suppressions=${SRC}/lsan.supp:print_suppressions=0")
else()
  set(ENV{LSAN_OPTIONS} "")
endif()
find_program(KV_SYMBOLIZER NAMES llvm-symbolizer-14 llvm-symbolizer HINTS /usr/lib/llvm-14/bin)
if(KV_SYMBOLIZER)
  set(ENV{ASAN_SYMBOLIZER_PATH} ${KV_SYMBOLIZER})
endif()

set(common_flags -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024
  -max_len=${max_len_${FUZZ_TARGET}})

# Sanitizer and property reports start at one of these lines.
set(report_start "(==[0-9]+==ERROR|kvrepro fuzz: property violated|runtime error:|ALARM: working on the last Unit|ERROR: libFuzzer|==[0-9]+== ERROR)")

function(kv_report_tail log_text out_var)
  string(REGEX MATCH "${report_start}.*" tail "${log_text}")
  if(tail STREQUAL "")
    set(tail "${log_text}")
  endif()
  string(LENGTH "${tail}" n)
  if(n GREATER 12000)
    string(SUBSTRING "${tail}" 0 12000 tail)
    string(APPEND tail "\n[... cut; the whole log is in ${BIN}/logs]")
  endif()
  set(${out_var} "${tail}" PARENT_SCOPE)
endfunction()

file(MAKE_DIRECTORY ${BIN}/logs ${BIN}/stats)

# ---- 1. regression pass over the committed inputs ---------------------------
file(GLOB corpus_files LIST_DIRECTORIES false ${SRC}/corpus/${FUZZ_TARGET}/*)
file(GLOB regression_files LIST_DIRECTORIES false ${SRC}/regressions/${FUZZ_TARGET}/*)
list(FILTER regression_files EXCLUDE REGEX "/\\.gitkeep$")
set(inputs ${corpus_files} ${regression_files})
list(SORT inputs)
list(LENGTH corpus_files n_corpus)
list(LENGTH regression_files n_regressions)
if(n_corpus EQUAL 0)
  message(FATAL_ERROR "fuzz_${FUZZ_TARGET}: no seed corpus in ${SRC}/corpus/${FUZZ_TARGET}")
endif()
execute_process(COMMAND ${exe} ${common_flags} -detect_leaks=1 ${inputs}
  RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
file(WRITE ${BIN}/logs/${FUZZ_TARGET}-regressions.log "${log}")
if(NOT rc EQUAL 0)
  # libFuzzer prints "Running: FILE" before each input and "Executed FILE"
  # after it: a FILE without its "Executed" line is the culprit. A failure
  # after the last input (a leak found at exit) names none: then each file
  # runs alone until one fails.
  set(culprit "")
  string(REGEX MATCHALL "Running: [^\n]+" running "${log}")
  if(running)
    list(GET running -1 last)
    string(REPLACE "Running: " "" culprit "${last}")
    string(FIND "${log}" "Executed ${culprit} in" done_at)
    if(NOT done_at EQUAL -1)
      set(culprit "")
    endif()
  endif()
  if(culprit STREQUAL "")
    foreach(f IN LISTS inputs)
      execute_process(COMMAND ${exe} ${common_flags} -detect_leaks=1 ${f}
        RESULT_VARIABLE rc1 OUTPUT_VARIABLE log1 ERROR_VARIABLE log1)
      if(NOT rc1 EQUAL 0)
        set(culprit "${f}")
        set(log "${log1}")
        break()
      endif()
    endforeach()
  endif()
  if(culprit STREQUAL "")
    set(culprit "(no single input fails alone: see ${BIN}/logs/${FUZZ_TARGET}-regressions.log)")
  endif()
  kv_report_tail("${log}" tail)
  message(FATAL_ERROR "fuzz_${FUZZ_TARGET}: regression pass FAILED (exit ${rc}) on input:\n"
    "  ${culprit}\n"
    "reproduce: ${exe} ${culprit}\n${tail}")
endif()
message(STATUS "fuzz_${FUZZ_TARGET}: regression pass: ${n_corpus} corpus + ${n_regressions} "
  "regression inputs, all pass")

# ---- 2. bounded fuzz run ------------------------------------------------------
# libhdf5 (and libcjson) are Debian's, not instrumented, and libhdf5 1.10.8
# is not robust against damaged files: it can hang or crash inside itself
# (README.md, "Findings"). Such a failure is not a defect of this project
# and must not make CI flaky, so a failure whose running code was a
# third-party library is recorded, its input kept, and fuzzing resumes
# (seed + 1) for the remaining time; so is a failure matching an open
# finding of known-open.txt. Everything else (a property, UBSan, ASan on our
# memory, a leak, a hang or crash in our code) fails the test.

# The first stack of a report (frames up to the next "#0"), one frame per
# list element.
function(kv_first_stack text out_var)
  string(REGEX MATCHALL "#[0-9]+ 0x[0-9a-f]+ [^\n]*" frames "${text}")
  set(stack "")
  set(seen_zero FALSE)
  foreach(f IN LISTS frames)
    if(f MATCHES "^#0 ")
      if(seen_zero)
        break()
      endif()
      set(seen_zero TRUE)
    endif()
    list(APPEND stack "${f}")
  endforeach()
  set(${out_var} "${stack}" PARENT_SCOPE)
endfunction()

# The first frame of a stack that is neither the sanitizer or libFuzzer
# runtime nor libc: whose code was running.
set(runtime_frame "in (__sanitizer|__asan|__lsan|__ubsan|__interceptor|___interceptor|fuzzer::|__libc_|__GI_)|in (malloc|calloc|realloc|free|memcpy|memmove|memset|strlen|strnlen|posix_memalign|raise|abort) |/libc\\.so|/ld-linux|libclang_rt|/libstdc\\+\\+|/libgcc_s")
function(kv_first_real_frame stack out_var)
  set(found "")
  foreach(f IN LISTS stack)
    if(NOT f MATCHES "${runtime_frame}")
      set(found "${f}")
      break()
    endif()
  endforeach()
  set(${out_var} "${found}" PARENT_SCOPE)
endfunction()

get_filename_component(kv_root "${SRC}/../.." ABSOLUTE)

# kv_classify(LOG OWNER_VAR WHAT_VAR): OWNER is "ours", "libhdf5" or
# "libcjson"; WHAT is a one-line description (kind, frame, caller of ours).
function(kv_classify log owner_var what_var)
  string(REGEX MATCH "${report_start}[^\n]*" headline "${log}")
  string(REGEX MATCH "${report_start}.*" rep "${log}")
  set(owner "ours")
  set(frame "")
  # Only a signal, a hang, a too-large allocation or a memory error in a
  # library's own memory can be a library's; a broken property, undefined
  # behaviour (only our code is instrumented), a leak (libhdf5's own are
  # suppressed) or memory exhaustion is ours.
  if(NOT rep MATCHES "kvrepro fuzz: property violated|runtime error:|LeakSanitizer|out-of-memory \\(used:")
    kv_first_stack("${rep}" stack)
    kv_first_real_frame("${stack}" frame)
    if(rep MATCHES "allocated by thread[^\n]*\n(.*)")
      # A bad access to memory our code allocated is ours, whoever made it.
      kv_first_stack("${CMAKE_MATCH_1}" alloc_stack)
      kv_first_real_frame("${alloc_stack}" alloc_frame)
      if(NOT alloc_frame MATCHES "libhdf5|libcjson")
        set(frame "${alloc_frame}")
      endif()
    endif()
    if(frame MATCHES "libhdf5")
      set(owner "libhdf5")
    elseif(frame MATCHES "libcjson")
      set(owner "libcjson")
    endif()
  endif()
  # Where our code called in: the first frame in this source tree.
  set(caller "")
  kv_first_stack("${rep}" stack)
  foreach(f IN LISTS stack)
    if(f MATCHES "in ([^ ]+) ${kv_root}/([^ ]+)")
      set(caller "${CMAKE_MATCH_1} ${CMAKE_MATCH_2}")
      break()
    endif()
  endforeach()
  string(REGEX REPLACE " \\(BuildId: [0-9a-f]+\\)" "" frame "${frame}")
  string(REGEX REPLACE "^#[0-9]+ 0x[0-9a-f]+ " "" frame "${frame}")
  string(STRIP "${headline}" headline)
  set(${owner_var} "${owner}" PARENT_SCOPE)
  set(${what_var} "${headline}; at ${frame}; called from ${caller}" PARENT_SCOPE)
endfunction()

set(work ${BIN}/work/${FUZZ_TARGET})
set(artifacts ${BIN}/artifacts/${FUZZ_TARGET})
set(third_party ${BIN}/artifacts/${FUZZ_TARGET}-third-party)
file(REMOVE_RECURSE ${work} ${artifacts} ${third_party})
file(MAKE_DIRECTORY ${work} ${artifacts} ${third_party})
file(WRITE ${BIN}/logs/${FUZZ_TARGET}.log "")
set(dirs ${work} ${SRC}/corpus/${FUZZ_TARGET})
if(n_regressions GREATER 0)
  list(APPEND dirs ${SRC}/regressions/${FUZZ_TARGET})
endif()

set(dict_flag "")
if(EXISTS ${SRC}/${FUZZ_TARGET}.dict)
  set(dict_flag -dict=${SRC}/${FUZZ_TARGET}.dict)
endif()

# Open findings in our code (known-open.txt: "<target|*> <regex>" lines,
# matched against the classification of a failure) are reported like
# third-party failures until they are fixed and their entry removed.
set(known_open "")
if(EXISTS ${SRC}/known-open.txt)
  file(STRINGS ${SRC}/known-open.txt known_lines REGEX "^[^#]")
  foreach(line IN LISTS known_lines)
    if(line MATCHES "^([^ ]+) (.+)$")
      if(CMAKE_MATCH_1 STREQUAL FUZZ_TARGET OR CMAKE_MATCH_1 STREQUAL "*")
        list(APPEND known_open "${CMAKE_MATCH_2}")
      endif()
    endif()
  endforeach()
endif()

string(TIMESTAMP t0 "%s")
math(EXPR deadline "${t0} + ${SECONDS}")
set(seed 1)
set(execs 0)
set(cov "?")
set(ft "?")
set(corp "?")
set(third_party_text "")
set(n_third_party 0)
set(failure "")
while(TRUE)
  string(TIMESTAMP now "%s")
  math(EXPR remaining "${deadline} - ${now}")
  if(remaining LESS 2 OR seed GREATER 100)
    break()
  endif()
  execute_process(COMMAND ${exe} ${common_flags} -seed=${seed} -max_total_time=${remaining}
    -print_final_stats=1 -detect_leaks=${leaks_${FUZZ_TARGET}} ${dict_flag}
    -artifact_prefix=${artifacts}/ ${dirs}
    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  file(APPEND ${BIN}/logs/${FUZZ_TARGET}.log "==== seed ${seed}, -max_total_time=${remaining}, exit ${rc}\n${log}")
  if(log MATCHES "stat::number_of_executed_units: *([0-9]+)")
    math(EXPR execs "${execs} + ${CMAKE_MATCH_1}")
  endif()
  string(REGEX MATCHALL "#[0-9]+[ \t]+[A-Z]+[ \t]+cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*" progress "${log}")
  if(progress)
    list(GET progress -1 last)
    string(REGEX MATCH "cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+/[0-9]+[a-zA-Z]*)" _ "${last}")
    set(cov "${CMAKE_MATCH_1}")
    set(ft "${CMAKE_MATCH_2}")
    set(corp "${CMAKE_MATCH_3}")
  endif()
  if(rc EQUAL 0)
    break()
  endif()
  kv_classify("${log}" owner what)
  if(owner STREQUAL "ours")
    foreach(re IN LISTS known_open)
      if(what MATCHES "${re}")
        set(owner "known-open")
        break()
      endif()
    endforeach()
  endif()
  file(GLOB found LIST_DIRECTORIES false ${artifacts}/*)
  if(owner STREQUAL "ours" OR NOT found)
    set(failure "${log}")
    break()
  endif()
  # A third-party failure: keep its input aside and go on.
  foreach(f IN LISTS found)
    get_filename_component(name ${f} NAME)
    file(RENAME ${f} ${third_party}/${name})
    string(APPEND third_party_text "  ${third_party}/${name}\n    ${owner}: ${what}\n")
    math(EXPR n_third_party "${n_third_party} + 1")
  endforeach()
  math(EXPR seed "${seed} + 1")
endwhile()
string(TIMESTAMP t1 "%s")
math(EXPR wall "${t1} - ${t0}")
file(REMOVE_RECURSE ${scratch})

set(summary "fuzz_${FUZZ_TARGET}: ${execs} executions in ${wall} s (seeds 1..${seed}, ${SECONDS} s budget), cov ${cov}, ft ${ft}, corpus ${corp}, set aside ${n_third_party} (third-party or known-open)")
file(WRITE ${BIN}/stats/${FUZZ_TARGET}.txt "${summary}\n${third_party_text}")
if(n_third_party GREATER 0)
  message(WARNING "fuzz_${FUZZ_TARGET}: ${n_third_party} failure(s) set aside: a third-party library "
    "failing by itself, or an open finding of known-open.txt (tests/fuzz/README.md); inputs "
    "kept:\n${third_party_text}")
endif()

if(NOT failure STREQUAL "")
  file(GLOB found LIST_DIRECTORIES false ${artifacts}/*)
  kv_report_tail("${failure}" tail)
  set(found_text "")
  foreach(f IN LISTS found)
    string(APPEND found_text "  ${f}\n")
  endforeach()
  if(found_text STREQUAL "")
    set(found_text "  (none saved: a failure at exit; the log is ${BIN}/logs/${FUZZ_TARGET}.log)\n")
  endif()
  message(FATAL_ERROR "fuzz_${FUZZ_TARGET}: FAILED (seed ${seed}); crashing input:\n${found_text}"
    "reproduce: ${exe} <input>; minimise: ${exe} -minimize_crash=1 -runs=20000 <input>;\n"
    "then keep it under tests/fuzz/found/${FUZZ_TARGET}/ (README.md)\n${summary}\n${tail}")
endif()
if(execs EQUAL 0 OR cov STREQUAL "?")
  message(FATAL_ERROR "fuzz_${FUZZ_TARGET}: the fuzz run executed nothing (see ${BIN}/logs/${FUZZ_TARGET}.log)\n${summary}")
endif()
message(STATUS "${summary}")
