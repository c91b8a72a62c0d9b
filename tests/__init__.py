"""Gantry's tests, arranged like the code: ``tests/jobs/test_admission.py`` tests
``jobs/admission.py``; journeys across apps are under ``tests/portal/``. Shared helpers
stay at this level (``conftest.py``, ``*_support.py``, ``k8s_fake/``, ``oidc_provider.py``)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPOSITORY = TESTS.parent
