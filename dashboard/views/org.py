"""Members (invite by email), connections and prices (secrets write-only), the organization's
unpriced-model policy, and management API tokens."""

from __future__ import annotations

from operator import attrgetter

from django.contrib import messages
from django.contrib.auth.tokens import default_token_generator
from django.core.mail import send_mail
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.views.decorators.http import require_POST

from catalog import services as catalog_services
from catalog.models import Connection, Model
from core.errors import InvalidChange, NotAllowed
from core.money import usd_input
from dashboard.access import org_view, render_org, require_manage
from dashboard.forms import (
    RATE_FIELDS,
    ConnectionForm,
    InviteForm,
    PolicyForm,
    RoleForm,
    TokenForm,
    add_service_error,
)
from dashboard.views.crud import Editor, Resource, delete_action, edit_page
from tenants import services
from tenants.members import add_member, change_member_role, remove_member
from tenants.models import ApiToken, Member
from tenants.selectors import Access

# --- members -------------------------------------------------------------------------------------


@org_view(manage=True)
def members(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    form = InviteForm(request.POST or None)
    if request.method == "POST":
        require_manage(access)
        if form.is_valid():
            try:
                member = add_member(
                    organization=org,
                    email=form.cleaned_data["email"],
                    role=form.cleaned_data["role"],
                    actor=access.actor,
                )
            except (InvalidChange, NotAllowed) as exc:
                add_service_error(form, exc)
            else:
                _send_invite(request, member)
                messages.success(request, f"Invited {member.user.email}: they get an email to set a password.")
                return redirect("dashboard:members", org.slug)
    rows = org.members.select_related("user").order_by("id")
    return render_org(
        request, access, "dashboard/members.html", "members", members=rows, form=form, roles=Member.Role.choices
    )


def _send_invite(request: HttpRequest, member: Member) -> None:
    # Outside any transaction (the member row is already committed): a slow mail server delays
    # only this response.
    user = member.user
    link = request.build_absolute_uri(
        reverse(
            "password_reset_confirm",
            kwargs={
                "uidb64": urlsafe_base64_encode(force_bytes(user.pk)),
                "token": default_token_generator.make_token(user),
            },
        )
    )
    send_mail(
        subject=f"You are invited to {member.organization.name} on capgate",
        message=f"You were added to {member.organization.name} as {member.role}.\n\n"
        f"Set your password and sign in: {link}\n",
        from_email=None,
        recipient_list=[user.email],
        fail_silently=True,
    )


@require_POST
@org_view(manage=True)
def member_role(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    member = get_object_or_404(Member, pk=pk, organization=access.organization)
    form = RoleForm(request.POST)
    if form.is_valid():
        try:
            change_member_role(member=member, role=form.cleaned_data["role"], actor=access.actor)
            messages.success(request, f"{member.user.email} is now {member.role}.")
        except (InvalidChange, NotAllowed) as exc:
            messages.error(request, exc.message)
    return redirect("dashboard:members", access.organization.slug)


member_remove = delete_action(
    Resource(Member, "Member", "members", label=lambda m: m.user.email),
    remove_member,
    instance="member",
    verb="removed",
)


# --- connections, prices and policy ----------------------------------------------------------------


@org_view(manage=True)
def connections(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    policy = PolicyForm(
        request.POST if "policy" in request.POST else None,
        initial={
            "allow_unpriced": org.allow_unpriced,
            "default_run_budget_usd": None
            if org.default_run_budget_nano is None
            else usd_input(org.default_run_budget_nano),
        },
    )
    if request.method == "POST" and "policy" in request.POST:
        require_manage(access)
        if policy.is_valid():
            services.update_organization(
                organization=org,
                actor=access.actor,
                allow_unpriced=policy.cleaned_data["allow_unpriced"],
                # the API's field: nano-USD
                default_run_budget_nano=policy.cleaned_data["default_run_budget_usd"],
            )
            messages.success(request, "Policy saved.")
            return redirect("dashboard:connections", org.slug)
    return render_org(
        request,
        access,
        "dashboard/connections.html",
        "connections",
        connections=org.connections.order_by("name"),
        policy=policy,
        routes=org.routes.prefetch_related("targets__connection", "targets__model__provider").order_by("name"),
        prices=Model.objects.select_related("provider").order_by("provider__slug", "name"),
    )


CONNECTIONS = Resource(
    Connection, "Connection", "connections", delete_url="dashboard:connection_delete", label=attrgetter("name")
)


class ConnectionEditor(Editor):
    resource = CONNECTIONS

    def form(self, data: QueryDict | None, access: Access, row: Connection | None, query: QueryDict) -> ConnectionForm:
        fields = ("name", "kind", "base_url", *RATE_FIELDS, "options", "enabled")
        return ConnectionForm(data, initial={f: getattr(row, f) for f in fields} if row else {})

    def save(self, access: Access, row: Connection | None, form: ConnectionForm) -> Connection:
        d = dict(form.cleaned_data)
        secret = d.pop("secret") or None  # empty: keep the stored secret
        if row is None:
            return catalog_services.create_connection(
                organization=access.organization, actor=access.actor, secret=secret or "", **d
            )
        catalog_services.update_connection(connection=row, actor=access.actor, secret=secret, **d)
        return row

    def note_for(self, row: Connection | None) -> str:
        return "The secret is stored encrypted and never shown again." if row and row.secret else ""


connection_edit = edit_page(ConnectionEditor())
connection_delete = delete_action(CONNECTIONS, catalog_services.delete_connection, instance="connection")


# --- API tokens ----------------------------------------------------------------------------------


@org_view(manage=True)
def tokens(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    form = TokenForm(request.POST or None)
    created = None
    if request.method == "POST":
        require_manage(access)
        if form.is_valid():
            try:
                assert access.member is not None  # a signed-in member: the token is theirs
                created = services.create_token(
                    member=access.member,
                    name=form.cleaned_data["name"],
                    scope=form.cleaned_data["scope"],
                    actor=access.actor,
                )
            except InvalidChange as exc:
                add_service_error(form, exc)
            else:
                form = TokenForm()
    rows = (
        ApiToken.objects.filter(organization=org)
        .select_related("member__user", "created_by")
        .order_by("revoked_at", "-id")
        if access.can_manage
        else []
    )
    return render_org(request, access, "dashboard/tokens.html", "tokens", tokens=rows, form=form, created=created)


token_revoke = delete_action(
    Resource(ApiToken, "Token", "tokens", label=attrgetter("name")),
    services.revoke_token,
    instance="token",
    verb="revoked",
)
