import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
application = get_wsgi_application()
# The URLconf, and with it every view, imported now rather than by the first request: under
# gunicorn --preload (make run) the workers fork with it loaded instead of each importing it
# while its first visitor waits.
get_resolver().url_patterns  # noqa: B018 - the import is the point
