from django.core.management.base import BaseCommand

from portal.demo import DEMO_PASSWORD, LOGINS, demo_seed, demo_seeded


class Command(BaseCommand):
    help = "Seed the demo tenants, people, images, simulated cluster and runs (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--speedup", type=int, default=30, help="simulated seconds per second")

    def handle(self, *args, speedup: int, **options):
        if demo_seeded():
            self.stdout.write("Demo data already present; keeping it.")
        else:
            demo_seed(speedup=speedup)
            self.stdout.write(self.style.SUCCESS("Seeded the demo."))
        self.stdout.write(f"\nDemo logins (password for all: {DEMO_PASSWORD}):")
        for login in LOGINS:
            self.stdout.write(f"  {login.username:<8} {login.persona:<15} {login.where}")
