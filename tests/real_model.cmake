# The real trained model (Gemma 3 270M, window 512) that `make test`'s set-up
# fetches, converts and decodes with transformers (scripts/ensure-real-model.sh,
# under the build directory). Without it (cmake run by hand, or
# KVREPRO_NO_REAL_MODEL=1) each test prints why and is reported as skipped.
set(KV_REAL_DIR ${CMAKE_BINARY_DIR}/real/gemma-3-270m)

# The reference against transformers' fp32 eager decodes of real text past
# the window: tokens identical, every logit of the 262144 within the golden
# tolerance, each row of a batch bitwise the row alone.
add_test(NAME real_golden COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/real_model.sh golden
  $<TARGET_FILE:kvrepro> ${KV_REAL_DIR})
set_tests_properties(real_golden PROPERTIES LABELS "real" SKIP_RETURN_CODE 77 TIMEOUT 900)

# Every CPU variant, eager and graph, bitwise the reference (max_rel_err 0)
# on the golden's first batch (pytorch #159855's shape): ~13 reference-sized
# decodes, so outside the default suite.
add_test(NAME real_variants COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/real_model.sh variants
  $<TARGET_FILE:kvrepro> ${KV_REAL_DIR})
set_tests_properties(real_variants PROPERTIES LABELS "real;long" SKIP_RETURN_CODE 77 TIMEOUT 3600)

# transformers in bfloat16 judged by its own bf16 yardstick (DESIGN §6): the
# (a) batch captured in bf16 with transformers' static cache under two
# attention kernels, eager and compiled, and with two planted broken layers;
# every correct run passes, both broken ones fail, the yardstick is recorded.
# Six captures and a compile: minutes, so outside the default suite.
add_test(NAME real_bf16 COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/real_model.sh bf16
  $<TARGET_FILE:kvrepro> ${KV_REAL_DIR} ${CMAKE_SOURCE_DIR}/.venv/bin/kvrepro-hf)
set_tests_properties(real_bf16 PROPERTIES LABELS "real;long" SKIP_RETURN_CODE 77 TIMEOUT 3600)

# gate --model DIR --golden FILE on a committed tiny golden (no set-up
# needed): it passes, it fails when the tolerance is below the error it
# measures (so it compared values), and the options it cannot honour are
# refused with exit 2.
add_test(NAME golden_mode COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/real_model.sh mode
  $<TARGET_FILE:kvrepro> ${CMAKE_SOURCE_DIR}/fixtures/hf/mistral)
set_tests_properties(golden_mode PROPERTIES LABELS "cli")
