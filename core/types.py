"""Types the apps share."""

from django.contrib.auth.models import AnonymousUser, User

# Whom a request is from, as ``request.user`` gives it: signed in or not. Every ``user`` and
# ``actor`` parameter takes one; ``user.is_authenticated`` narrows it to a ``User``.
UserLike = User | AnonymousUser


def signed_in(user: UserLike) -> User:
    """``user`` where it must be a person's row (an owner, a submitter, a lookup by user).

    Callers are behind a login (views, the API's token authentication); an anonymous user
    here is a bug, and TypeError says so before the ORM would refuse it less clearly.
    """
    if not user.is_authenticated:
        raise TypeError("an anonymous user has no rows of their own")
    return user
