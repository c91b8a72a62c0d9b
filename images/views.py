"""The image catalog: everyone browses what they may run; platform admins manage it.

Every page starts from a selector that answers 404 to users who may not see it: pending,
blocked and hidden images are as invisible to researchers as missing ones, and the admin
pages as invisible as pages that do not exist.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.http import form_page, or_404
from images.access import image_list_browsable, registry_list_manageable
from images.forms import ImageImportForm, ImageVisibilityForm, RegistryForm, registry_initial
from images.models import Image, Registry
from images.oci import RegistryError
from images.selectors import image_get_manageable, image_get_viewable, registry_get_manageable
from images.services import catalog, registries
from tenants.access import is_platform_admin, require_platform_admin

IMAGES_PER_PAGE = 25
REGISTRIES_PER_PAGE = 50


@login_required
@require_GET
def image_list(request: HttpRequest) -> HttpResponse:
    images = image_list_browsable(user=request.user)
    manages = is_platform_admin(request.user)
    status = request.GET.get("status", "") if manages else ""
    registry = request.GET.get("registry", "") if manages else ""
    query = request.GET.get("q", "").strip()
    if status in Image.Status.values:
        images = images.filter(status=status)
    else:
        status = ""
    if registry:
        images = images.filter(registry__name=registry)
    if query:
        images = images.filter(Q(repository__icontains=query) | Q(tag__icontains=query))
    page = Paginator(images, IMAGES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "images/image_list.html",
        {
            "page_obj": page,
            "images": page.object_list,
            "manages": manages,
            "statuses": Image.Status.choices,
            "status": status,
            "registries": or_404(registry_list_manageable, user=request.user) if manages else [],
            "registry": registry,
            "query": query,
            "filtered": bool(status or registry or query),
        },
    )


@login_required
@require_GET
def image_detail(request: HttpRequest, image_id: int) -> HttpResponse:
    image = or_404(image_get_viewable, user=request.user, image_id=image_id)
    return render(request, "images/image_detail.html", _detail_context(request, image))


def _detail_context(request: HttpRequest, image: Image, **extra) -> dict:
    manages = is_platform_admin(request.user)
    context = {
        "image": image,
        "manages": manages,
        "Status": Image.Status,
        "CheckStatus": Image.CheckStatus,
        "labels": sorted(image.labels.items()),
        "frameworks": sorted(image.frameworks.items()),
    }
    if manages:
        allowed = list(image.allowed_tenants.all())
        context["allowed_tenants"] = allowed
        context["visibility_form"] = extra.pop("visibility_form", None) or ImageVisibilityForm(
            initial={"visible_to_all": image.visible_to_all, "allowed_tenants": allowed}
        )
    return context | extra


@login_required
@require_http_methods(["GET", "POST"])
def image_import(request: HttpRequest) -> HttpResponse:
    or_404(require_platform_admin, request.user)

    def done(result) -> HttpResponse:
        image, created = result
        if created:
            messages.success(request, f"Imported {image}: pending review.")
        else:
            messages.info(
                request,
                f"{image} is in the catalog already ({image.get_status_display()}); "
                "its details were refreshed.",
            )
        return redirect("images:image_detail", image_id=image.pk)

    return form_page(
        request,
        ImageImportForm(request.POST)
        if request.method == "POST"
        else ImageImportForm(initial={"registry": request.GET.get("registry", "")}),
        save=lambda data: catalog.image_import(actor=request.user, **data),
        done=done,
        template="images/image_import.html",
    )


@login_required
@require_POST
def image_status(request: HttpRequest, image_id: int) -> HttpResponse:
    image = or_404(image_get_manageable, user=request.user, image_id=image_id)
    try:
        image = catalog.image_set_status(
            image=image, status=request.POST.get("status", ""), actor=request.user
        )
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"{image} is {image.get_status_display().lower()}.")
    return redirect("images:image_detail", image_id=image.pk)


@login_required
@require_POST
def image_visibility(request: HttpRequest, image_id: int) -> HttpResponse:
    image = or_404(image_get_manageable, user=request.user, image_id=image_id)
    form = ImageVisibilityForm(request.POST)
    if form.is_valid():
        try:
            catalog.image_set_visibility(image=image, actor=request.user, **form.cleaned_data)
        except ValidationError as exc:
            form.add_service_errors(exc)
        else:
            messages.success(request, f"Saved who may use {image}.")
            return redirect("images:image_detail", image_id=image.pk)
    context = _detail_context(request, image, visibility_form=form)
    return render(request, "images/image_detail.html", context, status=400)


@login_required
@require_POST
def image_recheck(request: HttpRequest, image_id: int) -> HttpResponse:
    image = or_404(image_get_manageable, user=request.user, image_id=image_id)
    try:
        image = catalog.image_recheck(image=image, actor=request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        level = messages.success if image.check_status == Image.CheckStatus.OK else messages.warning
        level(request, f"Re-checked: {image.get_check_status_display()}. {image.check_message}")
    return redirect("images:image_detail", image_id=image.pk)


@login_required
@require_GET
def registry_list(request: HttpRequest) -> HttpResponse:
    manageable = or_404(registry_list_manageable, user=request.user)
    page = Paginator(manageable, REGISTRIES_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "images/registry_list.html",
        {
            "page_obj": page,
            "rows": [(r, registries.registry_secret_is_set(r)) for r in page.object_list],
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def registry_create(request: HttpRequest) -> HttpResponse:
    or_404(require_platform_admin, request.user)

    def done(registry) -> HttpResponse:
        messages.success(request, f"Registered {registry.name}.")
        return redirect("images:registry_edit", name=registry.name)

    return form_page(
        request,
        RegistryForm(request.POST)
        if request.method == "POST"
        else RegistryForm(initial=registry_initial(None)),
        save=lambda data: registries.registry_create(actor=request.user, **data),
        done=done,
        template="images/registry_form.html",
        context={"registry": None},
    )


@login_required
@require_http_methods(["GET", "POST"])
def registry_edit(request: HttpRequest, name: str) -> HttpResponse:
    registry = or_404(registry_get_manageable, user=request.user, name=name)

    def done(saved) -> HttpResponse:
        messages.success(request, f"Saved {saved.name}.")
        return redirect("images:registry_edit", name=saved.name)

    return form_page(
        request,
        RegistryForm(request.POST, editing=True)
        if request.method == "POST"
        else RegistryForm(editing=True, initial=registry_initial(registry)),
        save=lambda data: registries.registry_update(registry=registry, actor=request.user, **data),
        done=done,
        template="images/registry_form.html",
        context={
            "registry": registry,
            "secret_is_set": registries.registry_secret_is_set(registry),
        },
    )


@login_required
@require_POST
def registry_test(request: HttpRequest, name: str) -> HttpResponse:
    """Call the registry's /v2/ with its saved settings: do the URL and credentials work?"""
    registry: Registry = or_404(registry_get_manageable, user=request.user, name=name)
    try:
        messages.success(request, registries.registry_test_connection(registry=registry))
    except RegistryError as exc:
        messages.error(request, f"Connection to {registry.name} failed: {exc}")
    return redirect("images:registry_edit", name=registry.name)
