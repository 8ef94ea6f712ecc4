# Every target installs what it needs into .venv itself: a fresh clone needs only `make demo` / `make test`.
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed

.PHONY: install test demo bench clean

install: $(STAMP)

# One line per phase, pip quiet (its errors still show); runs again only when a requirements file, setup.py or
# the interface build script changed.
$(STAMP): requirements.txt $(wildcard requirements-*.txt) setup.py scripts/install_ros.sh
	@echo "==> venv ($(VENV))"
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	@$(PIP) install --upgrade pip
	@echo "==> core requirements (torch, transformers)"
	@$(PIP) install -r requirements.txt
	@echo "==> ROS 2 Jazzy wheels"
	@$(PIP) install -r requirements-ros.txt
	@echo "==> simulator (highway-env) and training extras (tensorboard)"
	@$(PIP) install -r requirements-sim.txt -r requirements-train.txt -r requirements-data.txt
	@echo "==> CARLA 0.9.15 client"
	@$(PIP) install -r requirements-carla.txt
	@echo "==> nuScenes devkit (its numpy < 2 pin skipped: requirements-nuscenes.txt)" && $(PIP) install --no-deps -r requirements-nuscenes.txt
	@echo "==> wam_diff_msgs interfaces"
	@bash scripts/install_ros.sh $(VENV)
	@echo "==> wam_diff_ros (editable)"
	@$(PIP) install --no-deps --no-build-isolation -e .
	@touch $(STAMP)

test: install
	$(PY) -m pytest -q --durations=15 tests

demo: install
	$(VENV)/bin/wam-diff-demo

# decode speed of the shipped B = 32 model against its own AR (B = 1) reading, configurations interleaved, on the
# CPU; then whole plans of the shipped pair taking turns on the same frames, with planning L2 beside the speed
bench: install
	$(VENV)/bin/wam-diff bench --model models/nano-s-b32 --block-sizes 1,32 --steps 2,4 --repeats 60 --device cpu \
		--out runs/bench_nano_s_b32.json
	$(VENV)/bin/wam-diff bench --compare models/nano-s-ar models/nano-s-b32 \
		"nano-s-b32 node=models/nano-s-b32@2:threshold=0.3:dtype=auto" --samples 100 --threads 1 \
		--out runs/bench_compare.json

clean:
	rm -rf $(VENV) build *.egg-info
