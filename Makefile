# Shortcuts for the two commands of the README (they install what they need).
.PHONY: run test lint bench-store

run:
	bash scripts/run.sh

test:
	bash scripts/test.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy shared/evora services/evora_services tests bench scripts

bench-store:
	.venv/bin/python -m bench.store
