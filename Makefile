# On a fresh machine: `make plan` (the real job: the shipped DLRM-like example planned by us and by TorchRec's
# planner, compared under TorchRec's estimator, our plan exported to demo-out/), `make test`, `make bench`.
# Each builds the environment first when it is missing, and rebuilds it when the dependencies change.
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: setup plan bench test test-deep reliability

$(STAMP): pyproject.toml constraints.txt setup.sh
	bash setup.sh
	touch $(STAMP)

setup: $(STAMP)

plan: $(STAMP)
	$(VENV)/bin/shardbench demo

bench: $(STAMP)
	$(VENV)/bin/shardbench bench benchmarks/suites/quick.toml --fresh -o build/bench

test: $(STAMP)
	$(VENV)/bin/python -m pytest

# Property tests with fresh random draws and DEEP_FACTOR times the examples (tests/conftest.py).
test-deep: $(STAMP)
	HYPOTHESIS_PROFILE=deep $(VENV)/bin/python -m pytest -p no:cacheprovider

reliability: $(STAMP)
	$(VENV)/bin/python -m benchmarks.reliability
