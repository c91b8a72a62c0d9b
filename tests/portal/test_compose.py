"""docker-compose.yml, the Dockerfile and .env.example agree with the code they start.

No Docker engine is needed: every command is resolved against the installed code, every
variable against what portal/settings.py reads, and the compose file against the Compose
Specification schema vendored in tests/data/.
"""

import ast
import fnmatch
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from celery import Celery
from celery.app.utils import find_app
from django.core.management import get_commands
from jsonschema import Draft201909Validator

from tests import REPOSITORY, TESTS

ROOT = REPOSITORY
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ENV_EXAMPLE = ROOT / ".env.example"
SETTINGS_FILE = ROOT / "portal" / "settings.py"
# gunicorn's settings read the environment too (the web server's own knobs).
GUNICORN_CONF_FILE = ROOT / "portal" / "gunicorn_conf.py"
COMPOSE_SCHEMA = TESTS / "data" / "compose-spec.json"

REQUIRED_SERVICES = {"postgres", "redis", "web", "worker", "beat"}
ENV_READERS = {"env_str", "env_bool", "env_int", "env_list"}
# Interpolated by docker-compose.yml itself (the postgres service's password, also put into
# DATABASE_URL); documented in .env.example, never read by the settings.
COMPOSE_ONLY_VARIABLES = {"POSTGRES_PASSWORD"}
LOOPBACK = {"127.0.0.1", "::1"}
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
WSGI_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


# --- what the settings read -------------------------------------------------------------


def settings_variables() -> dict[str, int]:
    """Every environment variable portal/settings.py and portal/gunicorn_conf.py read, with
    the line that reads it."""
    found: dict[str, int] = {}
    for path in (SETTINGS_FILE, GUNICORN_CONF_FILE):
        found |= {name: line for name, line in _variables_read(path).items() if name not in found}
    return found


def _variables_read(path) -> dict[str, int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id in ENV_READERS)
            or ast.unparse(node.func) in {"os.environ.get", "os.getenv"}
        ):
            name_node = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            name_node = node.slice
        else:
            continue
        if not (isinstance(name_node, ast.Constant) and isinstance(name_node.value, str)):
            pytest.fail(f"{path.name}:{node.lineno} reads a variable whose name is not a literal")
        found.setdefault(name_node.value, node.lineno)
    return found


def env_example() -> dict[str, tuple[str, bool]]:
    """``.env.example`` as {name: (value, documented by a comment right above)}."""
    entries: dict[str, tuple[str, bool]] = {}
    previous = ""
    for number, raw in enumerate(ENV_EXAMPLE.read_text().splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z][A-Z0-9_]*", name), f".env.example:{number}: {raw!r}"
            assert name not in entries, f".env.example:{number}: {name} is set twice"
            entries[name] = (value, previous.startswith("#"))
        previous = line
    return entries


# --- what compose and the Dockerfile run ----------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def own_services() -> dict[str, dict]:
    """The services built from this repository (the others run upstream images)."""
    return {name: svc for name, svc in compose()["services"].items() if "build" in svc}


def split_script(script: str) -> list[list[str]]:
    """A shell script as its simple commands, split at ``&&``, ``||``, ``;``, ``|``, ``&``."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in SHELL_OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def simple_commands(command: str | list) -> list[list[str]]:
    """A compose ``command`` or Dockerfile CMD/RUN as argv lists, looking inside ``sh -c``."""
    if isinstance(command, str):
        argv_list = split_script(command)
    else:
        argv_list = [[str(part) for part in command]]
    result = []
    for argv in argv_list:
        if len(argv) == 3 and Path(argv[0]).name in {"sh", "bash"} and argv[1] == "-c":
            result.extend(simple_commands(argv[2]))
            continue
        while argv and (ASSIGNMENT.match(argv[0]) or argv[0] in {"exec", "env"}):
            argv = argv[1:]
        if argv:
            result.append(argv)
    return result


def option_value(argv: list[str], *names: str) -> str | None:
    for index, arg in enumerate(argv):
        for name in names:
            if arg == name and index + 1 < len(argv):
                return argv[index + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


@dataclass(frozen=True)
class Invocation:
    where: str
    kind: str  # celery | wsgi | manage | module
    target: str
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: {self.kind} {self.target}"


def invocations(where: str, command: str | list) -> list[Invocation]:
    """The Python entry points a command names: Celery apps, WSGI apps, manage.py commands."""
    found = []
    for argv in simple_commands(command):
        program = Path(argv[0]).name
        args = argv[1:]
        if program.startswith("python") and args[:1] == ["-m"] and len(args) > 1:
            found.append(Invocation(where, "module", args[1], tuple(argv)))
            program, args = args[1], args[2:]
        elif program.startswith("python") and args and Path(args[0]).name == "manage.py":
            program, args = "manage.py", args[1:]
        if program in {"manage.py", "django-admin"}:
            subcommand = next((arg for arg in args if not arg.startswith("-")), "")
            found.append(Invocation(where, "manage", subcommand, tuple(argv)))
        elif program == "celery":
            app = option_value(args, "-A", "--app")
            assert app, f"{where}: celery without -A/--app: {argv}"
            found.append(Invocation(where, "celery", app, tuple(argv)))
        elif program == "gunicorn":
            targets = [arg for arg in args if WSGI_TARGET.match(arg)]
            assert len(targets) == 1, f"{where}: no single module:callable in {argv}"
            found.append(Invocation(where, "wsgi", targets[0], tuple(argv)))
    return found


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, arguments = line.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    return instructions


def dockerfile_command(arguments: str) -> str | list:
    """CMD/ENTRYPOINT/RUN arguments: exec form (JSON array) or shell form."""
    if arguments.startswith("["):
        return json.loads(arguments)
    return arguments


def all_invocations() -> list[Invocation]:
    found = []
    for name, service in compose()["services"].items():
        if "command" in service:
            found += invocations(f"docker-compose.yml {name}", service["command"])
    for keyword, arguments in dockerfile_instructions():
        if keyword in {"CMD", "ENTRYPOINT", "RUN"}:
            found += invocations(f"Dockerfile {keyword}", dockerfile_command(arguments))
    return found


INVOCATIONS = all_invocations()


# --- the compose file -----------------------------------------------------------------------


def test_compose_defines_the_production_services():
    assert set(compose()["services"]) >= REQUIRED_SERVICES


def test_compose_file_is_valid_against_the_compose_specification():
    data = compose()
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    errors = [
        f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
        for error in Draft201909Validator(schema).iter_errors(data)
    ]
    assert errors == []
    services = data["services"]
    declared_volumes = set(data.get("volumes") or {})
    for name, service in services.items():
        depends_on = service.get("depends_on") or []
        assert set(depends_on) <= set(services), f"{name} depends on an undefined service"
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source and not source.startswith((".", "/", "~")):
                assert source in declared_volumes, f"{name} uses undeclared volume {source}"


def test_migrations_run_once_before_the_processes_start():
    services = compose()["services"]
    migrators = [
        name
        for name, service in services.items()
        if any(
            invocation.kind == "manage" and invocation.target == "migrate"
            for invocation in invocations(name, service.get("command") or [])
        )
    ]
    assert len(migrators) == 1 and migrators[0] not in {"web", "worker", "beat"}, migrators
    migrate = migrators[0]
    assert services[migrate]["restart"] == "no"
    assert services[migrate]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in services["postgres"]
    assert "healthcheck" in services["redis"]
    for name in ("web", "worker", "beat"):
        depends_on = services[name]["depends_on"]
        assert depends_on["postgres"]["condition"] == "service_healthy", name
        assert depends_on["redis"]["condition"] == "service_healthy", name
        assert depends_on[migrate]["condition"] == "service_completed_successfully", name


def test_each_process_runs_what_its_service_is_named_for():
    by_service = {
        invocation.where.removeprefix("docker-compose.yml "): invocation
        for invocation in INVOCATIONS
        if invocation.kind in {"celery", "wsgi"} and invocation.where.startswith("docker-compose")
    }
    assert by_service["web"].kind == "wsgi"
    assert by_service["worker"].kind == "celery"
    assert "worker" in by_service["worker"].argv
    assert by_service["beat"].kind == "celery"
    assert "beat" in by_service["beat"].argv


def test_published_ports_bind_loopback_only():
    for name, service in compose()["services"].items():
        assert service.get("network_mode") != "host", f"{name} would publish every port"
        for port in service.get("ports") or []:
            if isinstance(port, dict):
                host_ip = port.get("host_ip", "")
            else:
                spec = str(port)
                if spec.startswith("["):
                    host_ip = spec[1 : spec.index("]")]
                else:
                    parts = spec.split(":")
                    host_ip = parts[0] if len(parts) == 3 else ""
            assert host_ip in LOOPBACK, f"{name} publishes {port!r} beyond the host's loopback"


def test_web_publishes_the_port_gunicorn_binds():
    web = compose()["services"]["web"]
    (gunicorn,) = [
        invocation
        for invocation in INVOCATIONS
        if invocation.where == "docker-compose.yml web" and invocation.kind == "wsgi"
    ]
    bind = option_value(list(gunicorn.argv), "--bind", "-b")
    assert bind is not None and bind.startswith("0.0.0.0:")
    container_ports = {str(port).rsplit(":", 1)[-1].split("/")[0] for port in web["ports"]}
    assert container_ports == {bind.rsplit(":", 1)[1]}


def test_web_health_check_asks_a_host_the_example_allows():
    test = compose()["services"]["web"]["healthcheck"]["test"]
    (url,) = re.findall(r"https?://[^'\" ]+", " ".join(test))
    allowed_hosts = env_example()["GANTRY_ALLOWED_HOSTS"][0].split(",")
    assert urlsplit(url).hostname in allowed_hosts
    assert urlsplit(url).path == "/healthz"


def test_compose_beats_share_the_leader_lock_in_the_compose_redis(tmp_path):
    # Several beats are safe only when they share one lock (portal/beat.py): with compose's
    # environment and .env.example's values, the lock and the last runs are in its Redis.
    values = {name: value for name, (value, _) in env_example().items()}
    beat_env = compose()["services"]["beat"]["environment"]
    script = (
        "import json\n"
        "from django.conf import settings\n"
        "print(json.dumps([settings.CELERY_BEAT_SCHEDULER, settings.GANTRY_BEAT_LOCK_URL,\n"
        "  settings.GANTRY_BEAT_LOCK_KEY, settings.GANTRY_BEAT_LOCK_TTL_S]))\n"
    )
    overrides = {
        "CELERY_BROKER_URL": beat_env["CELERY_BROKER_URL"],
        "GANTRY_DATA_DIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=clean_env(**{**values, **overrides}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        "portal.beat:LeaderScheduler",
        "redis://redis:6379/0",
        "gantry:beat",
        30,
    ]
    (invocation,) = [
        i for i in INVOCATIONS if i.where == "docker-compose.yml beat" and i.kind == "celery"
    ]
    # A --schedule file would be ignored: the last runs are kept with the lock.
    assert option_value(list(invocation.argv), "--schedule", "-s") is None


def test_own_services_read_env_file_and_use_the_compose_servers():
    services = compose()["services"]
    assert own_services(), "no service is built from this repository"
    for name, service in own_services().items():
        env_files = service.get("env_file")
        env_files = [env_files] if isinstance(env_files, str) else env_files
        assert env_files == [".env"], name
        environment = service["environment"]
        for variable, expected_host in (
            ("DATABASE_URL", "postgres"),
            ("CELERY_BROKER_URL", "redis"),
            ("GANTRY_CACHE_URL", "redis"),
        ):
            url = re.sub(r"\$\{[^}]*\}", "placeholder", environment[variable])
            host = urlsplit(url).hostname
            assert host == expected_host and host in services, f"{name} {variable}"
        # The cache may be cleared: never the broker's Redis database.
        assert environment["GANTRY_CACHE_URL"] != environment["CELERY_BROKER_URL"], name


# --- variables: settings, .env.example and compose agree -------------------------------------


def test_settings_variables_are_discovered():
    # The grep must see the basics, or the comparisons below would pass vacuously.
    assert {"GANTRY_EMBEDDED", "DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} <= set(
        settings_variables()
    )


def test_env_example_documents_exactly_what_the_settings_read():
    read = set(settings_variables())
    documented = env_example()
    assert sorted(read - set(documented)) == [], "read by settings, missing from .env.example"
    assert sorted(set(documented) - read - COMPOSE_ONLY_VARIABLES) == [], (
        "in .env.example, read by nothing"
    )
    undocumented = [name for name, (_, has_comment) in documented.items() if not has_comment]
    assert undocumented == [], "needs a comment line right above it in .env.example"


def test_env_example_is_production_configuration():
    values = {name: value for name, (value, _) in env_example().items()}
    assert values["GANTRY_EMBEDDED"] == "0"
    assert values["GANTRY_DEBUG"] == "0"
    assert values["DJANGO_SECRET_KEY"].startswith("change-me")


def test_compose_variables_are_read_by_settings_or_compose_only():
    text = COMPOSE_FILE.read_text()
    referenced = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    referenced |= set(re.findall(r"(?<!\$)\$([A-Za-z_][A-Za-z0-9_]*)", text))
    read = set(settings_variables())
    assert sorted(referenced - read - COMPOSE_ONLY_VARIABLES) == []
    assert referenced >= COMPOSE_ONLY_VARIABLES, "a compose-only variable nothing uses"
    assert set(env_example()) >= COMPOSE_ONLY_VARIABLES, "compose-only variables need documenting"
    for name, service in own_services().items():
        unknown = set(service.get("environment") or {}) - read
        assert unknown == set(), f"{name} sets variables the settings do not read"


def clean_env(**overrides: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "portal.settings"}
    env.update(overrides)
    return env


def test_env_example_values_are_accepted_by_the_settings(tmp_path):
    values = {name: value for name, (value, _) in env_example().items()}
    script = (
        "import json\n"
        "from django.conf import settings\n"
        "print(json.dumps({'embedded': settings.EMBEDDED, 'debug': settings.DEBUG,\n"
        "  'engine': settings.DATABASES['default']['ENGINE'],\n"
        "  'secure_cookies': settings.SESSION_COOKIE_SECURE}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=clean_env(**{**values, "GANTRY_DATA_DIR": str(tmp_path)}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "embedded": False,
        "debug": False,
        "engine": "django.db.backends.postgresql",
        "secure_cookies": True,
    }


# --- the Dockerfile -------------------------------------------------------------------------


def test_dockerfile_builds_a_non_root_python_311_image():
    instructions = dockerfile_instructions()
    assert [args for keyword, args in instructions if keyword == "FROM"] == ["python:3.11-slim"]
    users = [args for keyword, args in instructions if keyword == "USER"]
    assert users and users[-1] not in {"root", "0", "0:0"}
    assert any(keyword in {"CMD", "ENTRYPOINT"} for keyword, _ in instructions)


def test_dockerfile_bakes_in_no_secret_and_no_embedded_mode():
    # ENV and ARG values persist in the image; the runtime must fail closed without a key.
    for keyword, arguments in dockerfile_instructions():
        if keyword in {"ENV", "ARG"}:
            assert "DJANGO_SECRET_KEY" not in arguments
            assert "GANTRY_EMBEDDED" not in arguments
    collect = [
        arguments
        for keyword, arguments in dockerfile_instructions()
        if keyword == "RUN" and "collectstatic" in arguments
    ]
    assert len(collect) == 1
    assert "GANTRY_EMBEDDED=1" in collect[0]
    assert "DJANGO_SECRET_KEY=" in collect[0]


def test_dockerignore_keeps_what_the_image_needs():
    patterns = [
        line.strip().strip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith(("#", "!"))
    ]
    needed = ["pyproject.toml", "manage.py", "templates", "static", "portal", "tenants", "images"]
    needed += ["jobs", "telemetry"]
    ignored = [name for name in needed if any(fnmatch.fnmatch(name, p) for p in patterns)]
    assert ignored == []


def test_dockerfile_collectstatic_step_works_without_servers(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--dry-run"],
        cwd=ROOT,
        env=clean_env(
            GANTRY_EMBEDDED="1",
            DJANGO_SECRET_KEY="build-time-only-not-a-secret",
            GANTRY_DATA_DIR=str(tmp_path),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- every entry point named anywhere resolves ------------------------------------------------


def test_entry_points_are_found():
    kinds = {(invocation.kind, invocation.target) for invocation in INVOCATIONS}
    assert ("manage", "migrate") in kinds
    assert ("manage", "collectstatic") in kinds
    assert any(kind == "celery" for kind, _ in kinds)
    assert any(kind == "wsgi" for kind, _ in kinds)


# Importing the WSGI module builds the app; WhiteNoise notes the uncollected static root.
@pytest.mark.filterwarnings("ignore:No directory at:UserWarning")
@pytest.mark.parametrize("invocation", INVOCATIONS, ids=str)
def test_entry_point_resolves(invocation):
    if invocation.kind == "celery":
        assert isinstance(find_app(invocation.target), Celery)
    elif invocation.kind == "wsgi":
        module_name, attribute = invocation.target.split(":")
        application = getattr(importlib.import_module(module_name), attribute)
        assert callable(application)
    elif invocation.kind == "manage":
        assert invocation.target in get_commands()
    else:
        assert importlib.util.find_spec(invocation.target) is not None
