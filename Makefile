# deltacoord — the two commands a newcomer needs are `make demo` and `make test` (`make check` between changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test check demo docs lint bench jars servers venv clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Reinstall when the project's dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing deltacoord and its test/dev dependencies into $(VENV) ..."
	$(BIN)/pip install -q -e '.[test,dev]'
	@touch $(STAMP)

venv: $(STAMP)

jars: $(STAMP)
	$(BIN)/deltacoord jars fetch all

# Local S3 (versitygw), Azure (Azurite) and GCS (fake-gcs-server) servers, built once into ~/.cache/deltacoord.
servers: $(STAMP)
	$(BIN)/python -m deltacoord.tooling.storage_servers install all

# The whole suite, in TEST_WORKERS test processes (pytest-xdist); each starts its own broker and storage
# servers when a test first needs them, and the Spark tests share one process (one Spark JVM). A test process
# that crashes ends the run at once, named: pytest-xdist's replacement worker under --dist loadgroup is never
# given the tests left, and the run waited with every worker idle until CI's time ran out.
TEST_WORKERS ?= 4

test: jars servers
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0 --durations=30 $(PYTEST_ARGS)

# The inner loop between two changes: the tests that need no broker, Spark or storage server, plus one
# integration test of each (`check` marker).
check: jars servers
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "check or not (kafka or spark or storage or cluster)" $(PYTEST_ARGS)

demo: jars
	$(BIN)/deltacoord demo

# The docs site into site/ (docs/*.md and the API reference from docstrings); any warning fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

lint: $(STAMP)
	$(BIN)/ruff check schemas storage reader writer coordinator tooling deltacoord tests bench
	$(BIN)/mypy

bench: jars
	$(BIN)/deltacoord bench --writers 16 --commits-per-writer 50

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
