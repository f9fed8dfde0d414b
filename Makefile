# Two commands: `make demo` (the main job) and `make check` (every test, what CI runs). Each sets itself up.
VENV ?= .venv
PY := $(VENV)/bin/python
# the package and its extras, editable: uv with pip's own settings (4x faster here), pip where uv cannot
INSTALL := $(PY) scripts/install.py

.PHONY: demo demo-gpt check test test-fast test-heavy venv lint typecheck docs clean

$(PY):
	python3 -m venv $(VENV)

venv: $(PY)

# Each demo reports the run it trained (lit-compute fit writes its TensorBoard folder to $LIT_COMPUTE_RUN_FILE), into
# that run's own folder: two demos at once never report or overwrite each other. A run that stops early is still
# reported (the report says at which step), and the command's exit status is the training's.
define fit_and_report
	@run_file=$$(mktemp); status=0; \
	LIT_COMPUTE_RUN_FILE=$$run_file $(VENV)/bin/lit-compute fit --config $(1) || status=$$?; \
	run=$$(cat $$run_file); rm -f $$run_file; \
	if [ -n "$$run" ]; then \
	  $(VENV)/bin/lit-compute report "$$run" --out "$$run/report.md" && \
	  echo "TensorBoard logs: $$run  (open: $(VENV)/bin/tensorboard --logdir lightning_logs)" && \
	  echo "Report:           $$run/report.md  (plots in $$run/report_plots/)"; \
	fi; exit $$status
endef

demo: $(PY)
	$(INSTALL) '.[all]'
	$(call fit_and_report,configs/quickstart.yaml)

demo-gpt: $(PY)
	$(INSTALL) '.[all]'
	$(call fit_and_report,configs/gpt.yaml)

# the suite runs on $(WORKERS) pytest-xdist workers (a fixed number, not one per core: each imports torch and
# Lightning, about 2 GB); WORKERS=0 runs it in this process
WORKERS ?= 2
XDIST := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist worksteal)

# Three tiers of one suite (CONTRIBUTING.md): test-fast (each change), test (before a push: within 8 minutes on 2
# cores), check = test then test-heavy (every test: what CI runs, .ci/run).

# the install (and a Prometheus server for the dashboard's test), lint, the type checker, then every test but the
# heavy ones (which also builds the docs site with --strict)
test: $(PY)
	$(INSTALL) '.[all,dev]'
	bash scripts/get_prometheus.sh $(VENV)
	$(MAKE) --no-print-directory lint
	$(VENV)/bin/mypy
	$(PY) -m pytest -q $(XDIST) --durations=20 -m "not heavy"

# the fast tier for every change: every unit and contract test, the multi-process and end-to-end ones (marked slow or
# heavy) left out
test-fast: $(PY)
	$(INSTALL) '.[all,dev]'
	$(PY) -m pytest -q $(XDIST) -m "not slow and not heavy"

# the tests marked heavy alone (several interpreters training end to end, the wheel, the tune: over about 10 s of CPU
# each); after `make test`, which installed what they need
test-heavy: $(PY)
	$(INSTALL) '.[all,dev]'
	$(PY) -m pytest -q $(XDIST) --durations=20 -m heavy

# every test: what CI runs (.ci/run, README.md's test command)
check:
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory test-heavy

# what the pre-commit hook runs (.pre-commit-config.yaml): the linter and the formatter's check, at 120 columns
lint: $(PY)
	$(VENV)/bin/ruff check lit_compute tests examples scripts
	$(VENV)/bin/ruff format --check lit_compute tests examples scripts

typecheck: $(PY)
	$(VENV)/bin/mypy

# the docs site into site/ (open site/index.html); --strict: a broken link or API reference fails the build
docs: $(PY)
	$(INSTALL) '.[dev]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf lightning_logs .pytest_cache build site *.egg-info
