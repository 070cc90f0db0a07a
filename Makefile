# Every target bootstraps what it needs: a local .venv, the pinned npm packages of interop/,
# and (for the tests) Debian's tshark and a Java runtime. Nothing has to be installed by hand first.
PY      := .venv/bin/python
BASE    := .venv/.installed-base
VENV    := .venv/.installed
NODE    := interop/node_modules/.installed
SYSDEPS := .venv/.sysdeps

.PHONY: demo test bench lint imports typecheck clean

# Two stages: the demo needs only p2psync's own dependencies (~85 MB); the tests add the
# pipeline's Spark stack and the tools (~1 GB), installed the first time a target needs them.
$(BASE): pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e .
	touch $@

$(VENV): $(BASE)
	.venv/bin/pip install -q -e '.[test]'
	touch $@

$(NODE): interop/package.json interop/package-lock.json
	cd interop && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# System packages, installed only when missing and when we are root: tshark (the BLIP
# dissector check), a Java runtime (Spark, for the data pipeline), and unshare + ip (the
# discovery and node tests run mDNS inside private network namespaces joined by veth pairs).
$(SYSDEPS): $(VENV)
	@missing=""; \
	command -v tshark >/dev/null 2>&1 || missing="$$missing tshark"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v unshare >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v nsenter >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing system packages:$$missing (not root: install them by hand)"; fi; \
	fi
	touch $@

demo: $(BASE)
	$(PY) -m p2psync demo

test: $(VENV) $(NODE) $(SYSDEPS)
	$(PY) -m pytest -q

bench: $(VENV) $(NODE) $(SYSDEPS)
	for f in tests/bench/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

lint: $(VENV)
	.venv/bin/ruff check p2psync tests interop
	.venv/bin/mypy p2psync tests/bench
	.venv/bin/lint-imports --no-cache

# The layer contract in pyproject.toml ([tool.importlinter]): layers point down, nothing
# imports the CLI, no import cycles.
imports: $(VENV)
	.venv/bin/lint-imports --no-cache

clean:
	rm -rf .venv interop/node_modules
