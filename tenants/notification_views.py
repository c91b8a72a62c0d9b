"""The user's own notifications: a paginated list and "mark all read".

Every query starts from the signed-in user, so another user's notifications are never
reachable, not even by guessing a page.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from tenants.selectors import notification_list_for_user, notification_unread_count
from tenants.services.notifications import notification_mark_all_read

NOTIFICATIONS_PER_PAGE = 25


@login_required
@require_GET
def notification_list(request: HttpRequest) -> HttpResponse:
    notifications = notification_list_for_user(user=request.user)
    page = Paginator(notifications, NOTIFICATIONS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "tenants/notifications.html",
        {
            "page_obj": page,
            "notifications": page.object_list,
            "unread_count": notification_unread_count(user=request.user),
        },
    )


@login_required
@require_POST
def notification_read_all(request: HttpRequest) -> HttpResponse:
    marked = notification_mark_all_read(user=request.user)
    if marked:
        noun = "notification" if marked == 1 else "notifications"
        messages.success(request, f"Marked {marked} {noun} as read.")
    return redirect("notifications:list")
