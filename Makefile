# Two commands do everything on a fresh machine: `make bench` (the main job) and `make test`.
# Both build the environment first when it is missing, and rebuild it when the dependencies change.
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: bench test test-deep reliability

$(STAMP): pyproject.toml constraints.txt setup.sh
	bash setup.sh
	touch $(STAMP)

bench: $(STAMP)
	$(VENV)/bin/shardbench bench benchmarks/suites/quick.toml --fresh -o build/bench

test: $(STAMP)
	$(VENV)/bin/python -m pytest

# Property tests with fresh random draws and DEEP_FACTOR times the examples (tests/conftest.py).
test-deep: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(VENV)/bin/python -m pytest -p no:cacheprovider

reliability: $(STAMP)
	$(VENV)/bin/python -m benchmarks.reliability
