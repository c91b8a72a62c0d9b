"""The experiment template pages: the list, creating, editing and deleting (tenant admins
and platform admins).
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.http import form_page, or_404
from jobs.access import (
    template_list_manageable,
    template_tenants_manageable,
)
from jobs.forms import (
    TemplateForm,
    template_initial,
)
from jobs.selectors.templates import template_get_manageable
from jobs.services import templates as template_services
from jobs.services.templates import TEMPLATE_FIELDS, template_save
from tenants.access import (
    is_platform_admin,
)

TEMPLATES_PER_PAGE = 50


@login_required
@require_GET
def template_list(request: HttpRequest) -> HttpResponse:
    """Templates the user manages (tenant admins: their tenants'; platform admins: all)."""
    templates = or_404(template_list_manageable, user=request.user)
    page = Paginator(templates, TEMPLATES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request, "jobs/template_list.html", {"page_obj": page, "templates": page.object_list}
    )


@login_required
@require_http_methods(["GET", "POST"])
def template_create(request: HttpRequest) -> HttpResponse:
    or_404(template_list_manageable, user=request.user)  # 404 for users who manage none
    tenants = list(template_tenants_manageable(user=request.user))
    choices = {"tenants": tenants, "allow_global": is_platform_admin(request.user)}

    def save(data: dict):
        tenant = next((t for t in tenants if t.slug == data["tenant"]), None)
        return template_save(actor=request.user, tenant=tenant, **_template_fields(data))

    def done(template) -> HttpResponse:
        messages.success(request, f"Template {template.name} is saved.")
        return redirect("jobs:template_list")

    return form_page(
        request,
        TemplateForm(request.POST, **choices)
        if request.method == "POST"
        else TemplateForm(**choices),
        save=save,
        done=done,
        template="jobs/template_form.html",
        context={"template": None},
    )


def _template_fields(data: dict) -> dict:
    return {name: data[name] for name in TEMPLATE_FIELDS}


@login_required
@require_http_methods(["GET", "POST"])
def template_edit(request: HttpRequest, template_id: int) -> HttpResponse:
    template = or_404(template_get_manageable, user=request.user, template_id=template_id)

    def save(data: dict):
        return template_save(
            actor=request.user, tenant=template.tenant, template=template, **_template_fields(data)
        )

    def done(saved) -> HttpResponse:
        messages.success(request, f"Template {saved.name} is saved.")
        return redirect("jobs:template_list")

    return form_page(
        request,
        TemplateForm(request.POST)
        if request.method == "POST"
        else TemplateForm(initial=template_initial(template)),
        save=save,
        done=done,
        template="jobs/template_form.html",
        context={"template": template},
    )


@login_required
@require_POST
def template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    template = or_404(template_get_manageable, user=request.user, template_id=template_id)
    template_services.template_delete(actor=request.user, template=template)
    messages.success(request, f"Template {template.name} is deleted.")
    return redirect("jobs:template_list")
