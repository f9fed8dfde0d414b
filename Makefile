# Two commands: `make demo` (the main job) and `make test`. Each sets itself up.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo demo-gpt test venv lint clean

$(PY):
	python3 -m venv $(VENV)

venv: $(PY)

demo: $(PY)
	$(PIP) install -e '.[all]'
	$(VENV)/bin/lit-compute fit --config configs/quickstart.yaml
	$(VENV)/bin/lit-compute report lightning_logs --latest --out lightning_logs/report.md
	@echo "TensorBoard logs: $(CURDIR)/lightning_logs  (open: $(VENV)/bin/tensorboard --logdir lightning_logs)"
	@echo "Report:           $(CURDIR)/lightning_logs/report.md  (plots in lightning_logs/report_plots/)"

demo-gpt: $(PY)
	$(PIP) install -e '.[all]'
	$(VENV)/bin/lit-compute fit --config configs/gpt.yaml
	$(VENV)/bin/lit-compute report lightning_logs --latest --out lightning_logs/report_gpt.md
	@echo "TensorBoard logs: $(CURDIR)/lightning_logs  (open: $(VENV)/bin/tensorboard --logdir lightning_logs)"
	@echo "Report:           $(CURDIR)/lightning_logs/report_gpt.md"

test: $(PY)
	$(PIP) install -e '.[all,dev]'
	$(PY) -m pytest -q

lint: $(PY)
	$(VENV)/bin/ruff check lit_compute tests examples

clean:
	rm -rf lightning_logs .pytest_cache build *.egg-info
