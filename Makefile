# Two commands do all set-up on a fresh machine: `make lab` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
JLPM := $(VENV)/bin/jlpm
TS_SOURCES := $(shell find labextension/src labextension/style labextension/schema -type f 2>/dev/null)
PY_SOURCES := pyproject.toml $(shell find pathways_kernel kernelspecs -name '*.py' -o -name '*.json' 2>/dev/null | grep -v labextension)
LAB_BUNDLE := pathways_kernel/labextension/package.json
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: all lab test lint docs test-ts test-py test-fast test-compat bench notebooks clean

all: $(VENV)/.installed

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Build tools first: the extension is built here, then installed without
# build isolation so pip does not re-download JupyterLab for every install.
$(VENV)/.build-tools: $(PY)
	$(PY) -m pip install -q "jupyterlab>=4.4,<5" "jupyter_builder>=1.3" "hatch-jupyter-builder>=0.9" "hatchling>=1.21" editables
	touch $@

node_modules/.installed: package.json $(VENV)/.build-tools
	$(JLPM) install
	touch $@

$(LAB_BUNDLE): node_modules/.installed $(TS_SOURCES) tsconfig.json
	$(JLPM) build:prod

$(VENV)/.installed: $(VENV)/.build-tools $(LAB_BUNDLE) $(PY_SOURCES)
	$(PY) -m pip install -q --no-build-isolation -e ".[test]"
	touch $@

# Tunix (RL on Pathways) and the dependencies its RL tests need, beside the venv and not in it
# (tests/server/test_local_server_tunix.py puts it on the client's path): --no-deps keeps the
# venv's own jax, orbax and optax; ~6 s and 73 MB from the package index.
TUNIX := $(VENV)/tunix-0.1.7
$(TUNIX)/.installed: $(PY)
	$(PY) -m pip install -q --target $(TUNIX) --no-deps google-tunix==0.1.7 flax==0.12.8 chex==0.1.92 \
		treescope==0.1.10 google-metrax==0.2.4 jaxtyping==0.3.11 wadler-lindig==0.1.8 grain==0.2.18 \
		array-record==0.8.6 clu==0.0.12 wrapt==2.5.2 tqdm==4.70.1 huggingface_hub==2.4.0 sentencepiece==0.2.3 \
		pillow==13.0.0 perfetto==0.59.1 qwix==0.1.8 tenacity==9.2.1 einops==0.8.2 toolz==1.2.0 \
		portpicker==1.6.0 cloudpickle==3.1.3 dm-tree==0.1.10
	touch $@

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser).
/usr/bin/chromium:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null

# Debian's Slurm and munge for the Slurm tests (tests/support/slurm.py runs its own munged, slurmctld and slurmd).
/usr/sbin/slurmctld:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null

lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab notebooks/quickstart.ipynb --LabApp.news_url=None $(if $(filter 0,$(shell id -u)),--allow-root,)

# Lint and types: ruff (lint + format check), mypy (strict, the whole package) and the import
# contracts of .importlinter (the layers, no cycles) for Python, ESLint + Prettier for
# the extension. Fix what they find; no blanket ignores.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p pathways_kernel
	$(VENV)/bin/lint-imports --no-cache
	$(JLPM) lint

test-ts: $(VENV)/.installed
	$(JLPM) test

# Two passes (docs/testing.md): test files in two processes (pytest-xdist; a file's tests stay
# in one process, so its module's kernels and servers are shared), then the `serial` tests,
# which assert wall time, with the machine to themselves. Both passes run; either fails the target.
PYTEST := $(VENV)/bin/pytest -q --durations=25
PARALLEL := -n 2 --dist loadfile
test-py: $(VENV)/.installed $(TUNIX)/.installed /usr/bin/chromium /usr/sbin/slurmctld
	@status=0; \
	$(PYTEST) $(PARALLEL) -m "not serial" || status=$$?; \
	$(PYTEST) -m serial || status=$$?; \
	exit $$status

# The inner loop: the parallel pass without the browser, Slurm, notebook and serial tests.
test-fast: $(VENV)/.installed $(TUNIX)/.installed
	$(PYTEST) $(PARALLEL) -m "not serial and not browser and not slurm" --ignore=tests/notebooks

# The docs site (Sphinx + MyST, docs/conf.py): warnings are errors, and -n makes every
# internal link, heading anchor and toctree entry resolve. -E rebuilds every page, so a
# warning in an unchanged page still fails. External links are not checked (no network).
docs: $(VENV)/.installed
	$(VENV)/bin/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html

test: lint docs test-ts test-py

# Fault semantics and elastic tests, and the local server driven by JAX's own proxy
# client (its protos come from the installed jaxlib), against every jax/jaxlib 0.10.x
# (from 0.10.1) the package index serves, each in its own venv: that venv holds only jax
# and jaxlib, and reaches the project and every other dependency through .venv. The
# cross-version test pairs that release's client and server with .venv's (both ways).
COMPAT_TESTS := tests/emulator/test_faults.py tests/training/test_elastic.py tests/state/test_snapshots.py tests/server/test_local_server.py \
	tests/server/test_local_server_cross_version.py
test-compat: $(VENV)/.installed
	@versions=$$($(PY) -m pip index versions jax 2>/dev/null | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' \
	  | grep -E '^0\.10\.[0-9]+$$' | awk -F. '$$3 >= 1' | sort -t. -k3 -n); \
	[ -n "$$versions" ] || { echo "test-compat: the index serves no jax 0.10.x >= 0.10.1"; exit 1; }; \
	site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	for v in $$versions; do \
	  env=.venv-compat/jax-$$v; \
	  [ -x $$env/bin/python ] || python3 -m venv $$env; \
	  $$env/bin/python -m pip install -q --no-deps "jax==$$v" "jaxlib==$$v"; \
	  own=$$($$env/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  printf '%s\n%s\n' "$(CURDIR)" "$$site" > $$own/pathways-kernel-dev.pth; \
	  echo "== jax/jaxlib $$v"; \
	  PATH=$(CURDIR)/$$env/bin:$$PATH JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $$env/bin/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) \
	    || failed="$$failed $$v"; \
	done; \
	[ -z "$$failed" ] || { echo "test-compat: failed on jax/jaxlib$$failed"; exit 1; }

# Every notebook in notebooks/ run top to bottom on the `pathways` kernel and saved with its
# outputs, so it reads well before anyone runs it (cells tagged needs-cluster are skipped;
# slurm.ipynb's rehearsal runs on a real Slurm). `make test` checks they are saved so.
notebooks: $(VENV)/.installed /usr/sbin/slurmctld
	$(PY) tests/support/notebooks.py

bench: $(VENV)/.installed
	@for script in bench/*.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) .venv-compat docs/_build node_modules labextension/lib pathways_kernel/labextension tsconfig.tsbuildinfo
