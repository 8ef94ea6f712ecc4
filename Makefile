# Every target installs what it needs into .venv itself: a fresh clone needs only `make demo` / `make test`.
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
EXTRA_INSTALL := $(wildcard scripts/install_*.sh)

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): requirements.txt setup.py $(wildcard requirements-*.txt) $(EXTRA_INSTALL)
	test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	for f in $(wildcard requirements-*.txt); do $(PY) -m pip install -q -r "$$f" || exit 1; done
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	for s in $(EXTRA_INSTALL); do bash "$$s" $(VENV) || exit 1; done
	touch $(STAMP)

test: install
	$(PY) -m pytest -q tests

demo: install
	$(VENV)/bin/wam-diff-demo

bench: install
	$(VENV)/bin/wam-diff bench --model nano --block-sizes 1,32 --steps 4,8,16 --batch-sizes 1 --device cpu --out runs/bench_nano.json

clean:
	rm -rf $(VENV) build *.egg-info
