"""Gantry settings, read from the environment and failing closed.

Two modes:
- embedded (``GANTRY_EMBEDDED=1``, what ``make run`` uses): SQLite and a filesystem Celery
  broker under ``GANTRY_DATA_DIR``, a secret key generated there on first start, nothing
  else to run;
- production (default): every secret and connection must be given, see ``.env.example``.
"""

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from portal import task_queues
from portal.env import (
    env_bool,
    env_int,
    env_list,
    env_str,
    parse_cache_url,
    parse_database_url,
)
from portal.metrics_files import metrics_dir_use
from portal.secret_key import embedded_secret_key
from tenants.oidc_roles import GroupRolesError, parse_group_roles

BASE_DIR = Path(__file__).resolve().parent.parent

EMBEDDED = env_bool("GANTRY_EMBEDDED", default=False)
# Off unless asked for, in embedded mode too: Django's debug pages show request bodies
# (passwords included) on a 500 and every URL pattern on a 404, and ``make run`` is shown
# to people. ``GANTRY_DEBUG=1 make run`` turns them on for development.
DEBUG = env_bool("GANTRY_DEBUG", default=False)
DATA_DIR = Path(env_str("GANTRY_DATA_DIR", default=str(BASE_DIR / "var"))).resolve()
if EMBEDDED:
    (DATA_DIR / "static").mkdir(parents=True, exist_ok=True)

# Gantry's own metrics (/metrics, docs/operations.md): every process keeps its values in
# files below this directory, shared by all processes of the deployment.
GANTRY_METRICS_DIR = Path(env_str("GANTRY_METRICS_DIR", default=str(DATA_DIR / "metrics")))
GANTRY_METRICS_DIR = GANTRY_METRICS_DIR.resolve()
metrics_dir_use(GANTRY_METRICS_DIR)
# The bearer token a scrape of /metrics must send; unset, /metrics answers 404.
GANTRY_METRICS_TOKEN = env_str("GANTRY_METRICS_TOKEN", default="")
if GANTRY_METRICS_TOKEN and len(GANTRY_METRICS_TOKEN) < 32:
    raise ImproperlyConfigured("GANTRY_METRICS_TOKEN must be at least 32 characters")

if EMBEDDED:
    # Generated on first start and kept in the data directory (0600): never a constant.
    SECRET_KEY = env_str("DJANGO_SECRET_KEY", default="") or embedded_secret_key(DATA_DIR)
else:
    SECRET_KEY = env_str("DJANGO_SECRET_KEY")

ALLOWED_HOSTS = env_list("GANTRY_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
# The port `make run` serves on (portal/embedded.py reads the same variable); the public URL
# below follows it unless it is set, so a demo on another port hands jobs and links that port.
GANTRY_PORT = env_int("GANTRY_PORT", default=8000)
if not 1 <= GANTRY_PORT <= 65535:
    raise ImproperlyConfigured(f"GANTRY_PORT must be a TCP port (1 to 65535), got {GANTRY_PORT}")
# Where jobs reach the portal's API (they get it as GANTRY_API_URL) and what links in e-mails
# point at: scheme, host, port.
GANTRY_PUBLIC_URL = env_str("GANTRY_PUBLIC_URL", default=f"http://127.0.0.1:{GANTRY_PORT}").rstrip(
    "/"
)
if not GANTRY_PUBLIC_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"GANTRY_PUBLIC_URL must be an http(s) URL, got {GANTRY_PUBLIC_URL!r}"
    )
# The workspace proxy (portal/workspace_proxy, docs/workspaces.md): the port it listens on,
# and the URL browsers reach it at (a workspace is {GANTRY_WORKSPACE_URL}/w/<run id>/). By
# default the next port after the portal's, on the portal's host.
GANTRY_WORKSPACE_PROXY_PORT = env_int("GANTRY_WORKSPACE_PROXY_PORT", default=GANTRY_PORT + 1)
if not 1 <= GANTRY_WORKSPACE_PROXY_PORT <= 65535:
    raise ImproperlyConfigured(
        f"GANTRY_WORKSPACE_PROXY_PORT must be a TCP port (1 to 65535), got "
        f"{GANTRY_WORKSPACE_PROXY_PORT}"
    )
GANTRY_WORKSPACE_URL = env_str(
    "GANTRY_WORKSPACE_URL", default=f"http://127.0.0.1:{GANTRY_WORKSPACE_PROXY_PORT}"
).rstrip("/")
if not GANTRY_WORKSPACE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"GANTRY_WORKSPACE_URL must be an http(s) URL, got {GANTRY_WORKSPACE_URL!r}"
    )
# The largest request body the proxy relays to a workspace (an upload), refused with 413
# while it streams; and how long it waits for a workspace's server to send anything.
GANTRY_WORKSPACE_MAX_UPLOAD_MB = env_int("GANTRY_WORKSPACE_MAX_UPLOAD_MB", default=1024)
GANTRY_WORKSPACE_UPSTREAM_TIMEOUT_S = env_int("GANTRY_WORKSPACE_UPSTREAM_TIMEOUT_S", default=60)
for _name in ("GANTRY_WORKSPACE_MAX_UPLOAD_MB", "GANTRY_WORKSPACE_UPSTREAM_TIMEOUT_S"):
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name} must be at least 1, got {globals()[_name]}")
# The demo's registry (images/demo_registry.py): its host, registry.gantry.example, answered
# in process so the demo's image tags resolve without a registry to run. On in embedded mode.
GANTRY_DEMO_REGISTRY = env_bool("GANTRY_DEMO_REGISTRY", default=EMBEDDED)
CSRF_TRUSTED_ORIGINS = env_list("GANTRY_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenants",
    "images",
    "clusters",
    "jobs",
    "telemetry",
    "finance",
    "policy",
    "portal",
]

MIDDLEWARE = [
    "portal.request_metrics.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "portal.security.SecurityHeadersMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A request the database could not serve (restarting, failing over): 503, send it again.
    "portal.database_unavailable.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

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
                "portal.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'gantry.sqlite3'}")
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A restarted PostgreSQL is met by a new connection: workers open one per task, web
    # requests health-check a kept one (CONN_HEALTH_CHECKS). A server that does not answer
    # at all must fail the task or request in seconds, not hold it: libpq waits forever.
    DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = 10
    # Parameters bound by the server, and a query a connection has sent twice is prepared:
    # PostgreSQL then stops planning it again (planning the run lists' joins costs
    # it more than running them; docs/benchmarks.md, *Load*). Off behind a connection pooler
    # that cannot keep prepared statements (PgBouncer in transaction mode before 1.21).
    if env_bool("GANTRY_DB_PREPARED_STATEMENTS", default=True):
        DATABASES["default"]["OPTIONS"] |= {"server_side_binding": True, "prepare_threshold": 2}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# Password logins are refused for a while after repeated failures (tenants/authentication.py);
# OpenID Connect logins go through the second backend (tenants/oidc.py).
AUTHENTICATION_BACKENDS = [
    "tenants.authentication.ThrottledModelBackend",
    "tenants.oidc.OidcBackend",
]
GANTRY_LOGIN_FAILURE_LIMIT = env_int("GANTRY_LOGIN_FAILURE_LIMIT", default=5)
# Higher than per username: many honest people can share one address behind a NAT.
GANTRY_LOGIN_FAILURE_LIMIT_PER_IP = env_int("GANTRY_LOGIN_FAILURE_LIMIT_PER_IP", default=20)
GANTRY_LOGIN_LOCKOUT_S = env_int("GANTRY_LOGIN_LOCKOUT_S", default=15 * 60)
# Proxies in front of the portal that append to X-Forwarded-For; 0 trusts REMOTE_ADDR only.
GANTRY_NUM_PROXIES = env_int("GANTRY_NUM_PROXIES", default=0)
if min(GANTRY_LOGIN_FAILURE_LIMIT, GANTRY_LOGIN_FAILURE_LIMIT_PER_IP, GANTRY_LOGIN_LOCKOUT_S) < 1:
    raise ImproperlyConfigured(
        "GANTRY_LOGIN_FAILURE_LIMIT, GANTRY_LOGIN_FAILURE_LIMIT_PER_IP and GANTRY_LOGIN_LOCKOUT_S "
        "must be at least 1"
    )
if GANTRY_NUM_PROXIES < 0:
    raise ImproperlyConfigured("GANTRY_NUM_PROXIES must be 0 or more")

# OpenID Connect single sign-on: off unless an issuer is given (docs/security.md).
# Exactly as the provider spells it in its tokens (a trailing slash matters).
GANTRY_OIDC_ISSUER = env_str("GANTRY_OIDC_ISSUER", default="")
GANTRY_OIDC_PROVIDER_NAME = env_str("GANTRY_OIDC_PROVIDER_NAME", default="single sign-on")
GANTRY_OIDC_GROUPS_CLAIM = env_str("GANTRY_OIDC_GROUPS_CLAIM", default="groups")
GANTRY_OIDC_USERNAME_CLAIM = env_str("GANTRY_OIDC_USERNAME_CLAIM", default="preferred_username")
try:
    GANTRY_OIDC_GROUP_ROLES = parse_group_roles(env_str("GANTRY_OIDC_GROUP_ROLES", default=""))
except GroupRolesError as error:
    raise ImproperlyConfigured(f"GANTRY_OIDC_GROUP_ROLES: {error}") from None
if GANTRY_OIDC_ISSUER:
    _issuer_schemes = ("https://", "http://") if DEBUG or EMBEDDED else ("https://",)
    if not GANTRY_OIDC_ISSUER.startswith(_issuer_schemes):
        raise ImproperlyConfigured(
            "GANTRY_OIDC_ISSUER must be an https:// URL (http:// only in embedded or debug mode)"
        )
    OIDC_RP_CLIENT_ID = env_str("GANTRY_OIDC_CLIENT_ID")
    OIDC_RP_CLIENT_SECRET = env_str("GANTRY_OIDC_CLIENT_SECRET")
else:
    OIDC_RP_CLIENT_ID = OIDC_RP_CLIENT_SECRET = ""
OIDC_RP_SIGN_ALGO = env_str("GANTRY_OIDC_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env_str("GANTRY_OIDC_SCOPES", default="openid email profile")
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_TIMEOUT = 10  # seconds, for every call to the provider
OIDC_VERIFY_SSL = True
OIDC_STORE_ACCESS_TOKEN = False
OIDC_STORE_ID_TOKEN = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("GANTRY_TIME_ZONE", default="UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Production (neither embedded nor debug) is served over HTTPS, usually by a TLS-terminating
# proxy in front: cookies are sent over HTTPS only and browsers are told to stay on HTTPS.
PRODUCTION_TLS = not DEBUG and not EMBEDDED
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = PRODUCTION_TLS
CSRF_COOKIE_SECURE = PRODUCTION_TLS
# Lax, not Strict: the OpenID Connect provider sends the browser back with a cross-site
# navigation, which must carry the session that holds the login's state and nonce.
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# The request header through which the proxy tells that the client used HTTPS, e.g.
# X-Forwarded-Proto; only set it when the proxy always sets or overwrites that header.
_proxy_ssl_header = env_str("GANTRY_PROXY_SSL_HEADER", default="")
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")
SECURE_SSL_REDIRECT = env_bool("GANTRY_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # container health checks use plain HTTP
if PRODUCTION_TLS:
    SECURE_HSTS_SECONDS = env_int("GANTRY_HSTS_SECONDS", default=31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("GANTRY_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env_bool("GANTRY_HSTS_PRELOAD", default=False)
# Content-Security-Policy (portal/security.py): scripts from this origin only, so no inline
# script, no event-handler attribute and no eval.
# Styles allow 'unsafe-inline' because Plotly adds its stylesheet at run time (and Swagger UI's
# page has a <style> block); a style cannot run code. blob: images are Plotly's PNG export.
CONTENT_SECURITY_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "blob:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    "NUM_PROXIES": GANTRY_NUM_PROXIES,  # the API's throttles see the client, not the proxy
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": "Submit, follow and cancel GPU experiments; every image pinned by digest.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "jobs.models.RunState",
        "AttemptStateEnum": "jobs.models.AttemptState",
        "RunKindEnum": "jobs.models.RunKind",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.openapi.every_operation_may_answer_400",
    ],
}

# One cache for every web worker and host: the API's throttles count there, so a limit holds
# however many processes serve. Production: Redis (its own database, not the broker's: a
# cache may be cleared). Embedded: a table in Gantry's own database.
CACHES = {
    "default": parse_cache_url(
        env_str("GANTRY_CACHE_URL", default="db://" if EMBEDDED else "redis://127.0.0.1:6379/1")
    )
}

# Celery: the broker is only a trigger; PostgreSQL (or SQLite when embedded) holds the truth.
CELERY_BROKER_URL = env_str(
    "CELERY_BROKER_URL", default="filesystem://" if EMBEDDED else "redis://127.0.0.1:6379/0"
)
CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    for _folder in ("queue", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
# One queue per kind of work, every task routed by name (portal/task_queues.py); a worker
# without -Q consumes them all.
CELERY_TASK_QUEUES = tuple(Queue(name) for name in task_queues.QUEUES)
CELERY_TASK_DEFAULT_QUEUE = task_queues.BACKGROUND
CELERY_TASK_ROUTES = {task: {"queue": queue} for task, queue in task_queues.QUEUE_OF_TASK.items()}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Workers and beat ride out a Redis restart by themselves (tests/portal/test_crash_recovery.py):
# they retry the connection for as long as it takes, also when Redis is not up yet at
# their start (Celery 6 stops inferring that from broker_connection_retry), instead of
# exiting after 100 tries. Nothing is lost meanwhile: the database holds the work, and beat
# re-drives what a lost message would have triggered.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_ALWAYS_EAGER = env_bool("GANTRY_CELERY_EAGER", default=False)
# Several beats may run; the one holding the leader lock sends periodic tasks (portal/beat.py,
# docs/operator-guide.md "Several beats"). The lock and the schedule's last runs are in Redis
# (the broker's by default: without it no task can be sent anyway) or, on the embedded
# default, a file lock in the data directory.
CELERY_BEAT_SCHEDULER = "portal.beat:LeaderScheduler"
GANTRY_BEAT_LOCK_URL = env_str(
    "GANTRY_BEAT_LOCK_URL",
    default=CELERY_BROKER_URL
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
    else f"file://{DATA_DIR / 'beat'}",
)
GANTRY_BEAT_LOCK_KEY = env_str("GANTRY_BEAT_LOCK_KEY", default="gantry:beat")
# A killed leader's lock expires after this long; a standby tries to take it this often.
GANTRY_BEAT_LOCK_TTL_S = env_int("GANTRY_BEAT_LOCK_TTL_S", default=30)
GANTRY_BEAT_LOCK_POLL_S = env_int("GANTRY_BEAT_LOCK_POLL_S", default=5)
if GANTRY_BEAT_LOCK_TTL_S < 3 or not 1 <= GANTRY_BEAT_LOCK_POLL_S <= GANTRY_BEAT_LOCK_TTL_S:
    raise ImproperlyConfigured(
        "GANTRY_BEAT_LOCK_TTL_S must be at least 3 and GANTRY_BEAT_LOCK_POLL_S between 1 and it"
    )

# Celery's worker and beat lower their CPU priority to this niceness at start (1 to 19; 0
# leaves it): on a machine they share with gunicorn, background work waits for requests
# instead of starving them (portal/process_priority.py; the load benchmark measures it).
GANTRY_WORKER_NICE = env_int("GANTRY_WORKER_NICE", default=10)
if not 0 <= GANTRY_WORKER_NICE <= 19:
    raise ImproperlyConfigured(
        f"GANTRY_WORKER_NICE must be a niceness from 0 (unchanged) to 19, got {GANTRY_WORKER_NICE}"
    )

GANTRY_ADMISSION_INTERVAL_S = env_int("GANTRY_ADMISSION_INTERVAL_S", default=5)
# A cycle whose inputs did not change since the last full one skips deciding, but not for
# longer than this: what the inputs' digest cannot see is decided again at least this often.
GANTRY_ADMISSION_FULL_EVERY_S = env_int("GANTRY_ADMISSION_FULL_EVERY_S", default=60)
# A change that calls for admission (a submit, a run that ended) starts a cycle this many
# milliseconds later; changes in the meantime share it (Slurm's batch_sched_delay, shorter).
GANTRY_ADMISSION_BATCH_MS = env_int("GANTRY_ADMISSION_BATCH_MS", default=500)
if GANTRY_ADMISSION_BATCH_MS < 0:
    raise ImproperlyConfigured("GANTRY_ADMISSION_BATCH_MS must be 0 or more (milliseconds)")
GANTRY_SYNC_INTERVAL_S = env_int("GANTRY_SYNC_INTERVAL_S", default=3)
# How often an open run page asks for what changed (its live sections; it stops once the
# run has finished and the page shows it).
GANTRY_LIVE_POLL_MS = env_int("GANTRY_LIVE_POLL_MS", default=3000)
if GANTRY_LIVE_POLL_MS < 200:
    raise ImproperlyConfigured("GANTRY_LIVE_POLL_MS must be at least 200 (milliseconds)")
GANTRY_BUDGET_CHECK_INTERVAL_S = env_int("GANTRY_BUDGET_CHECK_INTERVAL_S", default=60)
GANTRY_TELEMETRY_INTERVAL_S = env_int("GANTRY_TELEMETRY_INTERVAL_S", default=30)
# Raw telemetry bodies are kept this long after they are rolled up into minutes, so a
# window can be rolled up again; the minutes themselves are kept for good.
GANTRY_TELEMETRY_RAW_RETENTION_H = env_int("GANTRY_TELEMETRY_RAW_RETENTION_H", default=48)
# Start estimates (jobs.estimates): refreshed this often by a task of their own, looking this
# far ahead in at most this many simulated admission cycles.
GANTRY_ESTIMATE_INTERVAL_S = env_int("GANTRY_ESTIMATE_INTERVAL_S", default=60)
GANTRY_ESTIMATE_HORIZON_H = env_int("GANTRY_ESTIMATE_HORIZON_H", default=7 * 24)
GANTRY_ESTIMATE_MAX_STEPS = env_int("GANTRY_ESTIMATE_MAX_STEPS", default=200)
GANTRY_ESTIMATE_COST_FACTOR = env_int("GANTRY_ESTIMATE_COST_FACTOR", default=20)
CELERY_BEAT_SCHEDULE = {
    "admission-cycle": {
        "task": "jobs.tasks.admission_cycle",
        "schedule": float(GANTRY_ADMISSION_INTERVAL_S),
    },
    "start-estimates": {
        "task": "jobs.tasks.estimate_starts",
        "schedule": float(GANTRY_ESTIMATE_INTERVAL_S),
    },
    "sync-clusters": {
        "task": "jobs.tasks.sync_all_clusters",
        "schedule": float(GANTRY_SYNC_INTERVAL_S),
    },
    "budget-alerts": {
        "task": "jobs.tasks.budget_alerts",
        "schedule": float(GANTRY_BUDGET_CHECK_INTERVAL_S),
    },
    "telemetry-collect": {
        "task": "telemetry.tasks.telemetry_collect_all",
        "schedule": float(GANTRY_TELEMETRY_INTERVAL_S),
    },
    "attempt-accounting": {
        "task": "telemetry.tasks.accounting_compute_pending",
        "schedule": 60.0,
    },
    "daily-usage": {
        "task": "finance.tasks.daily_usage_update",
        "schedule": 120.0,
    },
    "idle-gpu-policy": {
        "task": "telemetry.tasks.idle_policy_enforce",
        "schedule": 60.0,
    },
    # Flag slow ranks from the rank windows that arrived since (docs/stragglers.md, Flags).
    "straggler-scan": {
        "task": "telemetry.tasks.straggler_scan",
        "schedule": 60.0,
    },
    # Warn about idle workspaces, suspend them after the tenant's threshold, keep their idle
    # streaks for the accounting (docs/workspaces.md, Idle from evidence).
    "workspace-idle-scan": {
        "task": "telemetry.tasks.workspace_idle_scan",
        "schedule": 60.0,
    },
}
# Fair share: how fast past usage is forgotten when ordering competing borrowers.
GANTRY_FAIR_SHARE_HALF_LIFE_H = env_int("GANTRY_FAIR_SHARE_HALF_LIFE_H", default=24)
# A run waiting longer than this holds the idle GPUs it is gathering (bounds starvation).
GANTRY_STARVATION_AFTER_S = env_int("GANTRY_STARVATION_AFTER_S", default=1800)
# How long a live attempt may be missing from its backend before it is declared LOST (its
# last sighting is kept to 15 s, jobs.services.backend_sync.LAST_SEEN_RESOLUTION, added here).
GANTRY_LOST_GRACE_S = env_int("GANTRY_LOST_GRACE_S", default=120)
# How long a submit keeps retrying an unreachable backend before the attempt fails.
GANTRY_SUBMIT_GIVE_UP_S = env_int("GANTRY_SUBMIT_GIVE_UP_S", default=1800)
# A Slurm or Kubernetes node inventory older than this is not trusted: admission places
# nothing on its nodes until the sync refreshes it (it runs every GANTRY_SYNC_INTERVAL_S).
GANTRY_INVENTORY_MAX_AGE_S = env_int("GANTRY_INVENTORY_MAX_AGE_S", default=60)
# How long a placed run may wait at its cluster without being given nodes (load from
# outside Gantry took them first) before it goes back to the queue for a new placement.
GANTRY_PLACEMENT_GRACE_S = env_int("GANTRY_PLACEMENT_GRACE_S", default=300)
# How long a workspace's server may take from its job's start to answer (its launcher
# reports the port once it does) before the sync ends the attempt as failed.
GANTRY_WORKSPACE_START_TIMEOUT_S = env_int("GANTRY_WORKSPACE_START_TIMEOUT_S", default=300)
if GANTRY_WORKSPACE_START_TIMEOUT_S < 1:
    raise ImproperlyConfigured(
        "GANTRY_WORKSPACE_START_TIMEOUT_S must be at least 1, got "
        f"{GANTRY_WORKSPACE_START_TIMEOUT_S}"
    )

# E-mail (budget alerts). Embedded mode prints mails to the console instead of sending them.
_EMAIL_BACKENDS = {
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
    "console": "django.core.mail.backends.console.EmailBackend",
    "dummy": "django.core.mail.backends.dummy.EmailBackend",
}
_email_backend = env_str("GANTRY_EMAIL_BACKEND", default="console" if EMBEDDED else "smtp")
if _email_backend not in _EMAIL_BACKENDS:
    raise ImproperlyConfigured(
        f"GANTRY_EMAIL_BACKEND must be one of {', '.join(_EMAIL_BACKENDS)}, got {_email_backend!r}"
    )
EMAIL_BACKEND = _EMAIL_BACKENDS[_email_backend]
EMAIL_HOST = env_str("GANTRY_EMAIL_HOST", default="localhost")
EMAIL_PORT = env_int("GANTRY_EMAIL_PORT", default=25)
EMAIL_TIMEOUT = 10  # seconds: a stuck mail server must not hold a worker
DEFAULT_FROM_EMAIL = env_str("GANTRY_EMAIL_FROM", default="gantry@localhost")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# Logs go to stderr, as text or as one JSON object per line (portal/log_format.py); either
# way every record learns the run, attempt and cluster it concerns (core/log_context.py).
GANTRY_LOG_FORMAT = env_str("GANTRY_LOG_FORMAT", default="text")
if GANTRY_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"GANTRY_LOG_FORMAT must be text or json, got {GANTRY_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "portal.log_format.JsonFormatter"},
    },
    "filters": {
        "log_context": {"()": "core.log_context.LogContextFilter"},
        "refusal_without_traceback": {"()": "portal.log_format.RefusalWithoutTraceback"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": GANTRY_LOG_FORMAT,
            "filters": ["log_context"],
        }
    },
    # Where Django logs each 4xx/5xx answer: a 403 is one line (portal/log_format.py).
    "loggers": {"django.request": {"filters": ["refusal_without_traceback"]}},
    "root": {"handlers": ["console"], "level": env_str("GANTRY_LOG_LEVEL", default="INFO")},
}
