"""The user and operator guides stay true: every link they and the README's documentation
list make leads to a file that exists, and what the operator guide says about the
docker-compose deployment matches docker-compose.yml and the Dockerfile."""

import re

import yaml

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

    assert sorted(compose["services"]) == ["beat", "migrate", "postgres", "redis", "web", "worker"]
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
    # Names of variables that settings point at (tokens of clusters, Prometheus), not settings.
    examples = {"GANTRY_PROM_TOKEN"}

    assert named - examples <= known, named - examples - known
    assert {"DJANGO_SECRET_KEY", "GANTRY_OIDC_ISSUER", "GANTRY_PUBLIC_URL"} <= named
