"""The billing inventory's gaps for one organization: the unlisted fields, tool types, betas and
headers its requests carried (passed where no blocking budget applied, noted on their usage
records), and the classifications that apply to it. Staff (the deployment's operator) classify
one here, for this organization or the whole deployment; members only read."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from catalog.classifications import ENDPOINTS, classify
from catalog.models import Classification
from core.errors import InvalidChange
from dashboard.access import org_view, render_org
from dashboard.forms import add_service_error
from ledger.models import UsageRecord
from tenants.audit import Actor
from tenants.selectors import Access

SEEN_DAYS = 30
NOTE = "unclassified: "


class ClassifyForm(forms.Form):
    scope = forms.ChoiceField(choices=[("organization", "this organization"), ("deployment", "every organization")])
    endpoint = forms.ChoiceField(choices=[(e, e) for e in ENDPOINTS])
    what = forms.ChoiceField(choices=Classification.What.choices)
    name = forms.CharField(max_length=200)
    cls = forms.ChoiceField(choices=Classification.Cls.choices, label="Class")
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))


def seen(*, organization_id: int, days: int = SEEN_DAYS) -> list[tuple[str, int]]:
    """(what:name, requests) passed unclassified in the last `days`, most frequent first."""
    since = timezone.now() - timedelta(days=days)
    notes = UsageRecord.objects.filter(
        organization_id=organization_id, admitted_at__gte=since, error__contains=NOTE
    ).values_list("error", flat=True)
    counts: Counter[str] = Counter()
    for note in notes:
        for name in note.split(NOTE, 1)[1].split(";", 1)[0].split(", "):
            counts[name.strip()] += 1
    return counts.most_common()


@org_view()
def inventory(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    staff = bool(getattr(request.user, "is_staff", False))
    form = ClassifyForm(request.POST or None)
    if request.method == "POST":
        if not staff:
            raise PermissionDenied("Only the deployment's operator (staff) classifies the billing inventory.")
        if form.is_valid():
            d = form.cleaned_data
            user = request.user
            try:
                classify(
                    actor=Actor(
                        label=getattr(user, "email", "") or user.get_username(), user_id=user.pk, operator=True
                    ),
                    organization=org if d["scope"] == "organization" else None,
                    endpoint=d["endpoint"],
                    what=d["what"],
                    name=d["name"],
                    cls=d["cls"],
                    reason=d["reason"],
                )
            except InvalidChange as exc:
                add_service_error(form, exc)
            else:
                messages.success(request, f"{d['what']} “{d['name']}” classified {d['cls']}.")
                return redirect("dashboard:inventory", org.slug)
    rows = Classification.objects.filter(Q(organization=org) | Q(organization__isnull=True)).order_by(
        "endpoint", "what", "name", "organization_id"
    )
    return render_org(
        request,
        access,
        "dashboard/inventory.html",
        "inventory",
        seen=seen(organization_id=org.id),
        days=SEEN_DAYS,
        classifications=rows,
        form=form if staff else None,
    )
