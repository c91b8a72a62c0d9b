"""The user and operator guides stay true: every link they and the README's documentation
list make leads to a file that exists, and what the operator guide says about the
docker-compose deployment matches docker-compose.yml and the Dockerfile."""

import re

import yaml

from clusters.job_env import GANTRY_ENV
from tests import REPOSITORY

ROOT = REPOSITORY
GUIDES = [ROOT / "docs" / "user-guide.md", ROOT / "docs" / "operator-guide.md"]
LOCAL_LINK = re.compile(r"\]\((?!https?://)([^)#\s]+)(?:#[^)]*)?\)")


def test_every_local_link_of_the_guides_and_the_readme_leads_to_a_file():
    sources = [*GUIDES, ROOT / "README.md"]
    links = {
        (source.name, target): (source.parent / target).resolve()
        for source in sources
        for target in LOCAL_LINK.findall(source.read_text())
    }
    missing = sorted(name for name, path in links.items() if not path.exists())

    assert missing == []
    readme = (ROOT / "README.md").read_text()
    assert "(docs/user-guide.md)" in readme and "(docs/operator-guide.md)" in readme


def test_the_operator_guide_names_the_services_and_volumes_of_docker_compose():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    guide = (ROOT / "docs" / "operator-guide.md").read_text()

    assert sorted(compose["services"]) == [
        "beat", "migrate", "postgres", "proxy", "redis", "web", "worker",
    ]  # fmt: skip
    for service in compose["services"]:
        assert f"`{service}`" in guide
    for volume in compose["volumes"]:
        assert f"`{volume}`" in guide
    assert compose["services"]["web"]["ports"] == ["127.0.0.1:8000:8000"]
    assert "**127.0.0.1:8000 only**" in guide
    assert compose["services"]["migrate"]["command"] == [
        "python", "manage.py", "migrate", "--noinput",
    ]  # fmt: skip
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "GANTRY_DATA_DIR=/var/lib/gantry" in dockerfile and "/var/lib/gantry" in guide
    assert "FROM python:3.11-slim" in dockerfile and "Python 3.11-slim" in guide


def test_the_guides_name_only_settings_that_exist():
    settings_source = (ROOT / "portal" / "settings.py").read_text()
    known = set(re.findall(r'"((?:GANTRY|DJANGO)_[A-Z0-9_]+)"', settings_source))
    named = {
        name
        for guide in GUIDES
        for name in re.findall(r"`((?:GANTRY|DJANGO)_[A-Z0-9_]+)`", guide.read_text())
    }
    # Names of variables that settings point at (tokens of clusters, Prometheus), and the
    # variables Gantry sets in a job's environment: not settings.
    examples = {"GANTRY_PROM_TOKEN", *GANTRY_ENV}

    assert named - examples <= known, named - examples - known
    assert {"DJANGO_SECRET_KEY", "GANTRY_OIDC_ISSUER", "GANTRY_PUBLIC_URL"} <= named


def test_the_architecture_map_names_only_modules_that_exist():
    """docs/architecture.md is the newcomer's map: every module path and every
    ``module.function`` it names is in the tree."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(
        re.findall(
            r"`((?:portal|core|tenants|images|clusters|jobs|telemetry|finance|tests|bench)/[\w/]*(?:\.py)?)`",
            text,
        )
    )
    missing = sorted(path for path in paths if not (ROOT / path).exists())
    assert len(paths) > 40
    assert missing == []
    named = re.findall(
        r"`((?:portal|core|tenants|images|clusters|jobs|telemetry|finance)/[\w/]+\.py)` `(\w+)`",
        text,
    )
    absent = sorted(
        f"{path} {name}"
        for path, name in named
        if not re.search(
            rf"^(?:def|class) {name}\b|^{name}(?:: [^=\n]+)? = ", (ROOT / path).read_text(), re.M
        )
    )
    assert named and absent == []
