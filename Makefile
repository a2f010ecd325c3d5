# The two commands a newcomer types: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/gpucloud
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15
# The several-host tests run beside the browser tests (config/dev/together.sh): a database and Redis db of their own.
TEST_CLUSTER_REDIS_URL ?= redis://127.0.0.1:6379/13
# The main suite runs on TEST_WORKERS pytest-xdist workers (it is mostly waiting: engines, workers, timeouts),
# a file to a worker; each has a Redis db of its own from TEST_WORKER_REDIS_DBS (tests/workers.py). The tests
# that stop or freeze what the whole machine shares (marked alone: PostgreSQL, the Docker engine), or need no other
# test's transaction open beside them, run after it.
TEST_WORKERS ?= 3
TEST_WORKER_REDIS_DBS ?= 15,12,11,10
# Tests run as production does (DEBUG off), with a throwaway key.
test: export SECRET_KEY ?= test-only-$(shell python3 -c 'import secrets; print(secrets.token_hex(24))')
test: export WHITENOISE_USE_FINDERS = true
# Threads the tests start (workers, WebSocket consumers) must not keep the test database open.
test: export DB_CONN_MAX_AGE = 0
test: export TEST_FAST_PASSWORD_HASHER = true

.PHONY: run test services lint bench bench-smoke messages prod-smoke run-smoke cluster cluster-down

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@command -v python3 >/dev/null || { echo "ERROR: python3 is missing: install Python 3.11 (apt-get install python3 python3-venv)."; exit 1; }
	@test -d $(VENV) || python3 -m venv $(VENV) || { echo "ERROR: could not create a virtualenv: apt-get install python3-venv"; exit 1; }
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements-dev.txt
	touch $@

services:
	@bash config/dev/services.sh

run: $(VENV)/.installed services
	@bash config/dev/run.sh

# Several GPU hosts on this machine (network namespaces, one Docker engine and node agent each):
# `make cluster` (N=3 hosts), `make cluster-down`; more in config/dev/cluster.sh.
# `make test` runs tests/cluster (which bring up their own) as its last stage: it needs root.
N ?= 3
cluster: $(VENV)/.installed
	@PYTHON=$(PY) bash config/dev/cluster.sh up $(N)

cluster-down:
	@bash config/dev/cluster.sh down

test: $(VENV)/.installed
	@DATABASE_URL=$(TEST_DATABASE_URL) WITH_BROWSER=1 bash config/dev/services.sh
	@$(PY) manage.py make_signing_keys
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) TEST_WORKER_REDIS_DBS=$(TEST_WORKER_REDIS_DBS) \
	  $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not browser and not cluster and not alone"
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(PY) -m pytest -p no:xdist -m alone
	@bash config/dev/together.sh \
	  browser "DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) DJANGO_ALLOW_ASYNC_UNSAFE=true $(PY) -m pytest -m browser tests/browser" \
	  cluster "DATABASE_URL=$(TEST_DATABASE_URL)_cluster REDIS_URL=$(TEST_CLUSTER_REDIS_URL) $(PY) -m pytest -m cluster tests/cluster"

# make run's whole stack on SQLite (config/dev/run_smoke.sh): run.sh started as a newcomer starts it, beside anything
# else (its own Redis db, ports, folders, deployment label), used through the API (create, run a minute, stop,
# settle, list, bill), then stopped as Ctrl-C stops it. About 2 minutes (3 when the Python image is built first).
RUN_SMOKE_REDIS_URL ?= redis://127.0.0.1:6379/7
run-smoke: $(VENV)/.installed
	@bash config/dev/services.sh
	RUN_SMOKE_REDIS_URL=$(RUN_SMOKE_REDIS_URL) bash config/dev/run_smoke.sh

# The production stack (docker-compose.yml) built from Debian's packages and brought up on a Docker
# engine of its own, then smoke-tested through its TLS proxy (config/prod/smoke.sh; needs root,
# mmdebstrap and docker-compose: apt-get install mmdebstrap docker-compose docker.io).
prod-smoke: $(VENV)/.installed
	PYTHON=$(PY) bash config/prod/smoke.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.installed
	$(PY) bench/scheduler_throughput.py

# Every bench/ script at a small size (bench/smoke.py): fails on any error, never on timing. Needs what
# `make test` needs (PostgreSQL, Redis, Docker, root for the several-host benches).
bench-smoke: $(VENV)/.installed
	@DATABASE_URL=$(TEST_DATABASE_URL) bash config/dev/services.sh
	$(PY) bench/smoke.py

# After changing translatable text: collect it into locale/zh_Hans/LC_MESSAGES/django.po, translate
# the new entries there, then run this again to compile the .mo (needs gettext: apt-get install gettext).
messages: $(VENV)/.installed
	@command -v msgfmt >/dev/null || { echo "ERROR: gettext is missing: apt-get install gettext"; exit 1; }
	SECRET_KEY=messages-only-0123456789abcdef0123456789 $(PY) manage.py makemessages -l zh_Hans \
		--ignore=.venv --ignore=var --ignore=bench --ignore=tests --ignore=static/vendor --ignore=client
	SECRET_KEY=messages-only-0123456789abcdef0123456789 $(PY) manage.py makemessages -d djangojs -l zh_Hans \
		--ignore=.venv --ignore=var --ignore=bench --ignore=tests --ignore=static/vendor --ignore=client
	SECRET_KEY=messages-only-0123456789abcdef0123456789 $(PY) manage.py compilemessages --ignore=.venv
