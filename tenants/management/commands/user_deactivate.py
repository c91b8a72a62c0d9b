from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from tenants.credentials import user_deactivate


class Command(BaseCommand):
    help = (
        "Deactivate an account: it can no longer log in, and its API tokens and sessions are "
        "revoked for good (tenants.credentials.user_deactivate)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, **options):
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user is named {options['username']!r}.")
        if user_deactivate(user=user, actor=None):
            self.stdout.write(f"Deactivated {user.username}; API tokens and sessions revoked.")
        else:
            self.stdout.write(f"{user.username} was inactive already; nothing changed.")
