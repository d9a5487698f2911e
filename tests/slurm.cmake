# docs/sharding.md's Slurm recipe on a real scheduler (tests/slurm.sh): a
# single-node Slurm started by the test, the doc's array of four shard gates
# and its merge job, the merged report against the unsharded gate's. Label
# "slurm", outside the default suite (`make test` runs -LE 'long|slurm'):
# four shard gates and an unsharded one take about 2 min idle and 4-5 min
# loaded on 2 cores, and it needs slurm-wlm and munge, which `make test` does
# not install. `make slurm-check` installs them and runs it. Skipped (77) with
# the reason without them, without root or with fewer than 2 CPUs.
add_test(NAME slurm_sharding COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm.sh
  $<TARGET_FILE:kvrepro> ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/slurm_work)
# The test's own bound on the jobs is 900 s (KV_SLURM_TIMEOUT); ctest's is
# above it, so that the test's trap, not a kill, stops the daemons.
set_tests_properties(slurm_sharding PROPERTIES LABELS slurm SKIP_RETURN_CODE 77 TIMEOUT 1800)
