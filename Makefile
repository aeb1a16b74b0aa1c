# Two entry points: `make demo` (set up, then run the main job on the default profile) and
# `make test` (set up, then run every test, the real-model ones included).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.inferplug-installed
TEST_STAMP := $(VENV)/.test-references-installed
# torch goes in first and pinned, and the pin constrains the package install too: then nothing later resolves
# a multi-GB CUDA build (pyproject does not cap torch, so that a CUDA machine keeps its own). Where the package
# index serves only CUDA wheels, add: PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH := torch==2.13.0
PIP_TORCH_ARGS ?=
# The tests' llama.cpp reference: llama-cpp-python built for this CPU's ISA with AMX off (a native build dies with
# SIGILL on AMX VMs), and llama.cpp's own HF-to-GGUF converter from the same release's sdist.
LLAMA_CPP_VERSION := 0.3.36

.PHONY: .venv setup demo test clean

.venv setup: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# Re-run when pyproject.toml changes; otherwise the stamp makes setup a no-op.
$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/pip install $(PIP_TORCH_ARGS) $(TORCH)
	echo "$(TORCH)" > $(VENV)/torch-pin.txt
	$(VENV)/bin/pip install -c $(VENV)/torch-pin.txt -e ".[all,test]"
	touch $(STAMP)

# The tests' references only (a build of minutes): `make demo` does not wait for them.
$(TEST_STAMP): $(STAMP)
	CMAKE_ARGS="$$($(VENV)/bin/python tests/fixtures/llama_cpp_cmake_flags.py)" \
		$(VENV)/bin/pip install -c $(VENV)/torch-pin.txt llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(VENV)/bin/python tests/fixtures/fetch_llama_cpp_converter.py $(VENV)/llama.cpp $(LLAMA_CPP_VERSION)
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(VENV)/bin/inferplug demo

# pytest exits 5 when it collects nothing: say so instead of failing silently.
test: $(TEST_STAMP)
	@status=0; $(VENV)/bin/pytest -q $(PYTEST_ARGS) || status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .inferplug-home
