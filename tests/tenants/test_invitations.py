"""Issue 31.8, people are added with consent and no oracle: a tenant admin invites a username
or an e-mail address and gets the same answer whether it names nobody, an inactive account,
an address two accounts share, or a real person; no answer maps an address to a username.
The person sees the invitation once signed in and joins only by accepting it."""

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.urls import reverse

from tenants.invitations import (
    invitation_accept,
    invitation_decline,
    membership_invite,
)
from tenants.models import AuditEvent, Invitation, Membership, Notification

RESEARCHER, TENANT_ADMIN = Membership.Role.RESEARCHER, Membership.Role.TENANT_ADMIN
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
VISION_BEFORE = {"alice": RESEARCHER, "arthur": RESEARCHER, "tara": TENANT_ADMIN}


def roles(tenant) -> dict[str, str]:
    return dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))


def audit_rows() -> list[tuple]:
    return [
        (event.actor.username, event.tenant.slug, event.action, event.target, event.after)
        for event in AuditEvent.objects.order_by("id")
    ]


def members_url(slug: str = "vision") -> str:
    return reverse("jobs:tenant_members", args=[slug])


def invite_from_the_page(client, identifier: str, role: str = RESEARCHER) -> tuple[int, str]:
    """The members page's form sent by a tenant admin: the status, and the page it leads to
    with the identifier replaced by a placeholder (to compare the answers' words)."""
    response = client.post(
        reverse("jobs:member_add", args=["vision"]), {"user": identifier, "role": role}
    )
    page = client.get(members_url()).content.decode()
    messages = re.findall(r'<li class="(message [^"]+)">(.*?)</li>', page, re.S)
    return response.status_code, repr(messages).replace(identifier, "IDENTIFIER")


@pytest.fixture
def accounts(world):
    """bob (nlp) with an address of his own; fiona and paul sharing one; an inactive account."""
    User.objects.filter(pk=world.researcher_b.pk).update(email="robert.b@example.org")
    User.objects.filter(pk__in=[world.finance.pk, world.platform_admin.pk]).update(
        email="shared@example.org"
    )
    User.objects.create_user("gone", email="gone@example.org", is_active=False)
    for user in (world.researcher_b, world.finance, world.platform_admin):
        user.refresh_from_db()
    return world


@time_machine.travel(NOW, tick=False)
def test_every_identifier_gets_the_same_answer_and_no_username(client, accounts):
    world = accounts
    client.force_login(world.tenant_admin_a)
    identifiers = [
        "nobody",  # no such account
        "nobody@example.org",
        "gone",  # an inactive account, by username and by address
        "gone@example.org",
        "shared@example.org",  # an address two accounts share
        "bob",  # a real person outside vision, by username and by address
        "robert.b@example.org",
    ]

    answers = {identifier: invite_from_the_page(client, identifier) for identifier in identifiers}

    assert set(answers.values()) == {
        (
            302,
            repr(
                [
                    (
                        "message message-success",
                        "Invited IDENTIFIER to vision as researcher. If that is the username or "
                        "e-mail address of an active account, its owner sees the invitation when "
                        "signed in and joins once they accept it; it expires on 2026-03-16 09:00 "
                        "UTC.",
                    )
                ]
            ),
        )
    }
    page = client.get(members_url()).content.decode()
    # The pending invitations show as typed; no username stands for an address.
    assert re.findall(r'<tr data-invitation="([^"]+)">', page) == identifiers[::-1]
    assert "fiona" not in page and "paul" not in page
    assert roles(world.vision) == VISION_BEFORE
    assert [row[2:4] for row in audit_rows()] == [
        ("invitation.send", f"{identifier} to vision") for identifier in identifiers
    ]
    # Only active accounts were told, each once: bob twice (username, address), fiona and
    # paul for the shared address; nobody for the inactive account.
    assert sorted(Notification.objects.values_list("user__username", flat=True)) == [
        "bob",
        "bob",
        "fiona",
        "paul",
    ]


@time_machine.travel(NOW, tick=False)
def test_the_invitee_sees_and_accepts_the_invitation(client, accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision,
        identifier="robert.b@example.org",
        role=TENANT_ADMIN,
        actor=world.tenant_admin_a,
        now=NOW,
    )
    client.force_login(world.researcher_b)

    listed = client.get(reverse("invitations:list")).content.decode()
    notice = Notification.objects.get(user=world.researcher_b)
    response = client.post(reverse("invitations:accept", args=[invitation.pk]))

    assert re.findall(r'<tr data-invitation="([^"]+)">', listed) == ["vision"]
    assert notice.message == (
        "tara invited you to join Vision Lab (vision) as tenant admin. Accept or decline it on "
        "your Invitations page."
    )
    assert (response.status_code, response.url) == (302, reverse("home"))
    assert roles(world.vision) == VISION_BEFORE | {"bob": TENANT_ADMIN}
    invitation.refresh_from_db()
    assert (invitation.state, invitation.decided_by, invitation.decided_at) == (
        Invitation.State.ACCEPTED,
        world.researcher_b,
        NOW,
    )
    assert audit_rows() == [
        (
            "tara",
            "vision",
            "invitation.send",
            "robert.b@example.org to vision",
            {"role": "tenant_admin"},
        ),
        ("bob", "vision", "invitation.accept", "bob@vision", {"role": "tenant_admin"}),
    ]
    # Answered: gone from the list, and a second answer finds nothing.
    assert (
        'data-invitation="vision"' not in client.get(reverse("invitations:list")).content.decode()
    )
    assert client.post(reverse("invitations:decline", args=[invitation.pk])).status_code == 404


@time_machine.travel(NOW, tick=False)
def test_nobody_else_can_answer_an_invitation(client, accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision, identifier="bob", role=RESEARCHER, actor=world.tenant_admin_a, now=NOW
    )

    for persona in ("researcher_a", "tenant_admin_a", "finance", "platform_admin"):
        client.force_login(getattr(world, persona))
        assert "data-invitation" not in client.get(reverse("invitations:list")).content.decode()
        for name in ("invitations:accept", "invitations:decline"):
            assert client.post(reverse(name, args=[invitation.pk])).status_code == 404
        with pytest.raises(Invitation.DoesNotExist):
            invitation_accept(invitation_id=invitation.pk, user=getattr(world, persona), now=NOW)

    invitation.refresh_from_db()
    assert invitation.state == Invitation.State.PENDING
    assert roles(world.vision) == VISION_BEFORE


def test_an_address_two_accounts_share_is_accepted_once(accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision,
        identifier="SHARED@example.org",
        role=RESEARCHER,
        actor=world.tenant_admin_a,
        now=NOW,
    )

    invitation_accept(invitation_id=invitation.pk, user=world.finance, now=NOW)

    with pytest.raises(Invitation.DoesNotExist):
        invitation_accept(invitation_id=invitation.pk, user=world.platform_admin, now=NOW)
    assert roles(world.vision) == VISION_BEFORE | {"fiona": RESEARCHER}


def test_an_invitation_expires_after_fourteen_days(accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision, identifier="bob", role=RESEARCHER, actor=world.tenant_admin_a, now=NOW
    )
    expired = NOW + timedelta(days=14)

    with pytest.raises(Invitation.DoesNotExist):
        invitation_accept(invitation_id=invitation.pk, user=world.researcher_b, now=expired)
    accepted = invitation_accept(
        invitation_id=invitation.pk, user=world.researcher_b, now=expired - timedelta(seconds=1)
    )

    assert (accepted.tenant, accepted.role) == (world.vision, RESEARCHER)


def test_a_declined_invitation_adds_nobody(accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision, identifier="bob", role=RESEARCHER, actor=world.tenant_admin_a, now=NOW
    )

    invitation_decline(invitation_id=invitation.pk, user=world.researcher_b, now=NOW)

    invitation.refresh_from_db()
    assert invitation.state == Invitation.State.DECLINED
    assert roles(world.vision) == VISION_BEFORE
    with pytest.raises(Invitation.DoesNotExist):
        invitation_accept(invitation_id=invitation.pk, user=world.researcher_b, now=NOW)


@time_machine.travel(NOW, tick=False)
def test_a_withdrawn_invitation_can_no_longer_be_accepted(client, accounts):
    world = accounts
    invitation = membership_invite(
        tenant=world.vision, identifier="bob", role=RESEARCHER, actor=world.tenant_admin_a, now=NOW
    )
    client.force_login(world.tenant_admin_a)

    response = client.post(reverse("jobs:invitation_revoke", args=["vision", invitation.pk]))

    assert (response.status_code, response.url) == (302, members_url())
    assert "Withdrew the invitation of bob." in client.get(members_url()).content.decode()
    with pytest.raises(Invitation.DoesNotExist):
        invitation_accept(invitation_id=invitation.pk, user=world.researcher_b, now=NOW)
    assert [row[2] for row in audit_rows()] == ["invitation.send", "invitation.revoke"]
    # A second withdrawal, and one through another tenant's page, find nothing.
    assert (
        client.post(reverse("jobs:invitation_revoke", args=["vision", invitation.pk])).status_code
        == 404
    )


def test_inviting_again_renews_the_one_pending_invitation(accounts):
    world = accounts
    first = membership_invite(
        tenant=world.vision, identifier="bob", role=RESEARCHER, actor=world.tenant_admin_a, now=NOW
    )
    later = NOW + timedelta(days=3)

    again = membership_invite(
        tenant=world.vision,
        identifier="bob",
        role=TENANT_ADMIN,
        actor=world.platform_admin,
        now=later,
    )

    assert again.pk == first.pk
    assert list(Invitation.objects.values_list("role", "expires_at", "invited_by__username")) == [
        (TENANT_ADMIN, later + timedelta(days=14), "paul")
    ]
    assert Notification.objects.filter(user=world.researcher_b).count() == 1


@pytest.mark.parametrize(
    ("identifier", "role", "errors"),
    [
        ("alice", RESEARCHER, {"user": ["alice is already a member of vision."]}),
        ("   ", RESEARCHER, {"user": ["Enter a username or an e-mail address."]}),
        (
            "x" * 255,
            RESEARCHER,
            {"user": ["A username or an e-mail address has at most 254 characters; this has 255."]},
        ),
        (
            "bo\x00b",
            RESEARCHER,
            {"user": ["A username or an e-mail address has no control characters."]},
        ),
        ("bob", "owner", {"role": ["Choose a role: researcher or tenant admin."]}),
    ],
)
def test_bad_invitations_are_refused_and_change_nothing(accounts, identifier, role, errors):
    world = accounts
    with pytest.raises(ValidationError) as refused:
        membership_invite(
            tenant=world.vision,
            identifier=identifier,
            role=role,
            actor=world.tenant_admin_a,
            now=NOW,
        )

    assert refused.value.message_dict == errors
    assert not Invitation.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_invitations_of_one_identifier_make_one(accounts):
    world = accounts
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def invite() -> None:
        try:
            barrier.wait(timeout=10)
            membership_invite(
                tenant=world.vision,
                identifier="bob",
                role=RESEARCHER,
                actor=world.tenant_admin_a,
                now=NOW,
            )
        except BaseException as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=invite) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert failures == []
    assert Invitation.objects.count() == 1
    assert Notification.objects.filter(user=world.researcher_b).count() == 1
