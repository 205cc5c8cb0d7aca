"""Organization access for dashboard views: log in, be a member (else 404), and for writes have
the role for it (else 403). The one rule set lives in tenants/selectors.py."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.selectors import Access, access_for_user, organizations_for


def org_view(*, manage: bool = False) -> Callable:
    """Wrap `view(request, access, ...)`. `manage=True`: POSTs need owner or admin."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, slug: str, *args: Any, **kwargs: Any) -> HttpResponse:
            access = access_for_user(user=request.user, slug=slug)  # 404 for outsiders
            if manage and request.method == "POST" and not access.can_manage:
                raise PermissionDenied("Only owners and admins can change this.")
            return view(request, access, *args, **kwargs)

        return wrapper

    return decorate


def require_manage(access: Access) -> None:
    if not access.can_manage:
        raise PermissionDenied("Only owners and admins can change this.")


def render_org(request: HttpRequest, access: Access, template: str, section: str, **context: Any) -> HttpResponse:
    return render(
        request,
        template,
        {
            "org": access.organization,
            "access": access,
            "section": section,
            "organizations": organizations_for(request.user),
            **context,
        },
    )
