"""Issue 22.4 in a real browser (headless Debian Chromium through Playwright, against a live
server): a tenant admin invites a user, who accepts; the admin changes the role, removes them
and reads it all in the audit log; a researcher creates an API token, sees it once, copies
it, uses it against the API, sees its last use and revokes it."""

import json
import re
import urllib.error
import urllib.request

from playwright.sync_api import Page, expect

from tenants.models import ApiToken, AuditEvent, Membership
from tests.browser_support import screenshot
from tests.portal.test_browser_journeys import rows_of

pytest_plugins = ["tests.browser_support"]

SECRET = re.compile(r"^gty_[A-Za-z0-9_-]{43}$")


def accept_and_record(page: Page) -> list[str]:
    """Accept every confirmation the page asks; the questions, in order."""
    asked: list[str] = []

    def answer(dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    return asked


def test_a_tenant_admin_invites_a_user_changes_the_role_and_removes_them(
    world, persona_page, tmp_path
):
    page = persona_page(world.tenant_admin_a)
    asked = accept_and_record(page)
    page.goto("/tenants/vision/members/")
    expect(page.locator("h1")).to_have_text("Members of Vision Lab")

    # Tara invites fiona; the answer would be the same for a name that matches nobody.
    page.get_by_label("Username or e-mail address").fill("fiona")
    page.locator("[data-member-add] select[name=role]").select_option("researcher")
    page.get_by_role("button", name="Send invitation").click()
    expect(page.locator(".messages")).to_contain_text(
        "Invited fiona to vision as researcher. If that is the username or e-mail address of an "
        "active account, its owner sees the invitation when signed in and joins once they "
        "accept it;"
    )
    assert [row[:3] for row in rows_of(page, "invitations")] == [["fiona", "Researcher", "tara"]]
    assert [row[0] for row in rows_of(page, "members")] == ["tara", "alice", "arthur"]

    # Fiona finds it once signed in, and joins by accepting it.
    invitee = persona_page(world.finance)
    invitee.goto("/accounts/invitations/")
    invitee.get_by_role("button", name="Join vision").click()
    expect(invitee.locator(".messages")).to_have_text("You joined vision as researcher.")

    page.reload()
    assert page.locator("table[data-table=invitations]").count() == 0
    assert rows_of(page, "members") == [
        ["tara", "Tenant admin", "0", "0", "0", "Remove"],
        ["alice", "Researcher", "0", "0", "0", "Remove"],
        ["arthur", "Researcher", "0", "0", "0", "Remove"],
        ["fiona", "Researcher", "0", "0", "0", "Remove"],
    ]

    page.get_by_label("Role of fiona", exact=True).select_option("tenant_admin")
    page.get_by_role("button", name="Save the role of fiona").click()
    expect(page.locator(".messages")).to_have_text("fiona is now tenant admin of vision.")
    assert [row[:2] for row in rows_of(page, "members")] == [
        ["fiona", "Tenant admin"],
        ["tara", "Tenant admin"],
        ["alice", "Researcher"],
        ["arthur", "Researcher"],
    ]
    screenshot(page, "tenant-admin-members-manage", tmp_path)

    page.get_by_role("button", name="Remove fiona").click()
    expect(page.locator(".messages")).to_have_text(
        "Removed fiona from vision. Their runs stay; they can no longer submit to vision."
    )
    assert asked == [
        "Remove fiona from vision? Their runs stay; they can no longer submit to vision."
    ]
    assert [row[0] for row in rows_of(page, "members")] == ["tara", "alice", "arthur"]
    assert not Membership.objects.filter(user=world.finance).exists()

    # Now tara is the last admin again: she cannot step down.
    page.get_by_label("Role of tara", exact=True).select_option("researcher")
    page.get_by_role("button", name="Save the role of tara").click()
    expect(page.locator("[data-member-error]")).to_have_text(
        "tara is the last tenant admin of vision and cannot be demoted: make another member "
        "tenant admin first."
    )

    page.goto("/audit/?tenant=vision")
    audit = page.locator("table tbody tr").evaluate_all(
        "rows => rows.map(row => [...row.cells].slice(1).map(cell => cell.innerText.trim()))"
    )
    assert audit == [
        ["tara", "membership.remove", "fiona@vision", "role: tenant_admin → —"],
        ["tara", "membership.role_change", "fiona@vision", "role: researcher → tenant_admin"],
        ["fiona", "invitation.accept", "fiona@vision", "role: — → researcher"],
        ["tara", "invitation.send", "fiona to vision", "role: — → researcher"],
    ]
    assert AuditEvent.objects.count() == 4


def api_runs(live_server, secret: str) -> int:
    """The status of GET /api/v1/runs/ with the token, from outside the browser."""
    request = urllib.request.Request(
        f"{live_server.url}/api/v1/runs/", headers={"Authorization": f"Bearer {secret}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            json.load(response)
            return response.status
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_user_creates_a_token_sees_it_once_uses_it_and_revokes_it(
    world, persona_page, live_server, tmp_path
):
    page = persona_page(world.researcher_a)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    asked = accept_and_record(page)
    page.goto("/accounts/")
    expect(page.locator("[data-new-token]")).to_have_count(0)

    page.get_by_label("Name").fill("laptop")
    page.get_by_label("Expires after (days)").fill("30")
    with page.expect_response("**/accounts/tokens/new/") as answer:
        page.get_by_role("button", name="Create token").click()
    assert "no-store" in answer.value.headers["cache-control"]
    expect(page.locator("#new-token-title")).to_have_text("Your new token laptop")
    secret = page.locator("#new-token").input_value()
    assert SECRET.match(secret), secret
    token = ApiToken.objects.get()
    assert (token.name, token.prefix, token.last_used_at) == ("laptop", secret[4:12], None)
    screenshot(page, "account-new-token", tmp_path)

    page.get_by_role("button", name="Copy").click()
    expect(page.locator("[data-copy-status]")).to_have_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()") == secret

    assert api_runs(live_server, secret) == 200

    # The account page again: the token is listed, used, and its secret is gone for good.
    page.goto("/accounts/")
    expect(page.locator("[data-new-token]")).to_have_count(0)
    assert secret not in page.content()
    row = page.locator(f"tr[data-token='{token.pk}']")
    cells = row.locator("td").all_inner_texts()
    assert cells[0:2] == ["laptop", f"gty_{secret[4:12]}…"]
    assert cells[5] == "active"
    token.refresh_from_db()
    assert token.last_used_at is not None
    expect(row.locator("td").nth(4).locator("time")).to_have_attribute(
        "datetime", token.last_used_at.isoformat()
    )

    row.get_by_role("button", name="Revoke").click()
    expect(page.locator(".messages")).to_have_text(f"Revoked the token laptop ({secret[4:12]}…).")
    assert asked == ["Revoke the token laptop? Scripts using it stop working."]
    expect(page.locator(f"tr[data-token='{token.pk}'] td").nth(5)).to_have_text("revoked")
    assert api_runs(live_server, secret) == 401
