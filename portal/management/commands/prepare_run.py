from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "What `make run` does before it starts its processes, in one process (one start of "
        "Django instead of three): migrate, seed the demo once, empty the metric files."
    )

    def add_arguments(self, parser):
        parser.add_argument("--speedup", type=int, default=30, help="simulated seconds per second")

    def handle(self, *args, speedup: int, **options):
        # The system checks ran once, for this command; call_command skips them for each step.
        call_command("migrate", interactive=False, verbosity=0, stdout=self.stdout)
        call_command("seed_demo", speedup=speedup, stdout=self.stdout)
        # Before any of make run's processes runs: they record into fresh metric files.
        call_command("metrics_reset", verbosity=0, stdout=self.stdout)
