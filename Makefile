# Two commands for a fresh machine:  `make predict` (the main job) and `make test`.
PY ?= python3
STAMP := .setup-stamp

.PHONY: setup predict test bench clean

# torch first, pinned to the CPU wheel, so nothing pulls the CUDA build.
$(STAMP): pyproject.toml
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

predict: $(STAMP)
	$(PY) -m perfsim predict

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(PY) benchmarks/bench_compressors.py --quick
	$(PY) benchmarks/bench_simulator.py

clean:
	rm -rf $(STAMP) build *.egg-info .pytest_cache
