# The production image: docker-compose.yml runs the portal (gunicorn), the Celery worker,
# Celery beat and the migration step from it.
FROM python:3.11-slim

# Settings find templates/ and static/ relative to the source tree, so the code runs from
# /app (first on the path) rather than from the copy pip puts into site-packages.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=portal.settings \
    GANTRY_DATA_DIR=/var/lib/gantry

RUN groupadd --system --gid 10001 gantry \
    && useradd --system --uid 10001 --gid gantry --home-dir /var/lib/gantry --no-create-home \
        --shell /usr/sbin/nologin gantry \
    && install -d -o gantry -g gantry -m 0750 /var/lib/gantry /var/lib/gantry/beat \
        /var/lib/gantry/metrics

WORKDIR /app
COPY . .
RUN pip install . && rm -rf build *.egg-info

# No secret exists at build time: this one step runs in embedded mode with a throwaway key.
# Static files land in $GANTRY_DATA_DIR/static, readable by the gantry user.
RUN GANTRY_EMBEDDED=1 DJANGO_SECRET_KEY=build-time-only-not-a-secret \
    python manage.py collectstatic --noinput

USER gantry
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-"]
