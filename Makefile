# rigup's entry points. Run as root on a Debian/Ubuntu machine (the lab boots containers).
#   make demo   a throwaway lab host, provisioned by deploy.py
#   make test   unit tests, then the lab tests (converge, converge again, verify, destroy)
#   make vllm-real  a real vLLM installed on a lab host, timed (pip, uv, patched git path)
#   make docs   regenerate docs/roles/*.md, docs/group_vars.schema.json and docs/refusals.md

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PYINFRA:= $(VENV)/bin/pyinfra
N      ?= 1
PROFILE?= a100

.PHONY: venv demo test unit docs lab-up lab-down lab-list bench-lab bench-ansible bench-fleet bench-overlap bench-smoke bench-balancer bench-handover bench-faults vllm-real clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && rm -rf $(VENV) && \
	  $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@# the real parsers the boundary's writers are read back with (tests/unit/test_boundary_formats.py)
	@command -v haproxy >/dev/null && command -v nft >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy nftables; }
	@touch $@

demo: venv
	$(PY) -m tests.demo

test: venv
	$(PY) -m tests.lanes

unit: venv
	$(PY) -m pytest -m "not lab"

docs: venv
	$(PY) -m tests.docs

lab-up: venv
	$(PY) -m tests.lab up -n $(N) --profile $(PROFILE)
	$(PY) -m tests.lab.sources

lab-down: venv
	$(PY) -m tests.lab down

lab-list: venv
	$(PY) -m tests.lab list

bench-lab: venv
	$(PY) -m tests.bench_lab

bench-ansible: venv
	$(PY) -m tests.bench_ansible

bench-fleet: venv
	$(PY) -m tests.bench_fleet

bench-overlap: venv
	$(PY) -m tests.bench_overlap

bench-smoke: venv
	$(PY) -m tests.bench_smoke

bench-balancer: venv
	$(PY) -m tests.bench_balancer

bench-handover: venv
	$(PY) -m tests.bench_handover

# issue 65's longer kill points (a roll killed mid-burn-in, a build switch and a tune sweep killed
# midway: pytest.ini's faults marker), on one lab; make test leaves them out
bench-faults: venv
	$(PY) -m pytest -p no:cacheprovider -m faults $$($(PY) -c 'from tests.lanes import FAULTS; print(*FAULTS)')

# a real vLLM from PyPI installed by roles/vllm on a lab host, pip against uv, then the patched
# git path (several GB through the lab's proxy; not part of `make test`): tests/vllm_real.py
vllm-real: venv
	$(PY) -m tests.vllm_real

clean: lab-down
	rm -rf $(VENV)
