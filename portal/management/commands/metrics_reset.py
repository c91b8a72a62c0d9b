from django.conf import settings
from django.core.management.base import BaseCommand

from portal.metrics_files import host_metrics_reset


class Command(BaseCommand):
    help = (
        "Forget the metric values that this host's Gantry processes recorded; run it before "
        "starting them, never while they run (portal/metrics_files.py)."
    )

    def handle(self, *args, **options):
        directory = host_metrics_reset(settings.GANTRY_METRICS_DIR)
        if options["verbosity"]:
            self.stdout.write(f"Emptied {directory}.")
