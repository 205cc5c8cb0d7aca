"""One edit page and one delete action for every dashboard resource (budgets, rate limits,
projects, connections, routes, prices, alert channels, keys, tokens, members, end customers).

A resource says what it is (`Resource`: model, how it is scoped to the organization, its list
page) and, for editing, how its form is built and which service saves it (`Editor`). The views
here hold the steps they all share:

1. log in and be a member of the URL's organization (else 404), with the role to change it (else
   403): `org_view` and the editor's or deleter's check;
2. the row is the organization's own (`get_object_or_404` on `org_field`), so an outsider's id
   is 404 and changes nothing;
3. a POST calls one audited service with the caller as actor; the service's InvalidChange comes
   back as a form error (edit) or an error message (delete), and nothing is changed;
4. on success: a message naming the row, and back to the resource's list page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from django import forms
from django.contrib import messages
from django.db import models
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from core.errors import InvalidChange, NotAllowed
from dashboard.access import org_view, render_org, require_manage
from dashboard.forms import add_service_error
from tenants.selectors import Access


@dataclass(frozen=True)
class Resource:
    model: type[models.Model]
    noun: str  # starts every message about one row: "Budget “Team cap” saved."
    section: str  # the navigation entry its pages are under, and its list page's URL name
    org_field: str = "organization"
    delete_url: str | None = None  # the edit page's delete button, when it has one
    label: Callable[[Any], str] = str  # how a message names a row

    @property
    def back(self) -> str:
        """The list page a save or delete returns to."""
        return f"dashboard:{self.section}"

    def row(self, access: Access, pk: int) -> Any:
        return get_object_or_404(self.model, pk=pk, **{self.org_field: access.organization})

    def done(self, request: HttpRequest, row: Any, verb: str) -> None:
        messages.success(request, f"{self.noun} “{self.label(row)}” {verb}.")


class Editor:
    """How one resource is edited. Subclasses set `resource` and implement `form` and `save`;
    the rest has defaults that read as the other pages do."""

    resource: ClassVar[Resource]
    new_submit: ClassVar[str] = "Save"
    created: ClassVar[str] = "saved"  # the verb of a new row's message
    # POSTs need owner or admin; False where `check` decides alone (list prices: staff).
    manage: ClassVar[bool] = True

    def check(self, request: HttpRequest, access: Access) -> None:
        require_manage(access)

    def get_row(self, access: Access, pk: int) -> Any:
        return self.resource.row(access, pk)

    def form(self, data: QueryDict | None, access: Access, row: Any | None, query: QueryDict) -> forms.Form:
        """The bound form (`data`: the POST, else None); `query` is the page's GET parameters."""
        raise NotImplementedError

    def save(self, access: Access, row: Any | None, form: Any) -> Any:
        """Call the one service (it raises InvalidChange for a refused change); return the row."""
        raise NotImplementedError

    def title(self, row: Any | None) -> str:
        noun = self.resource.noun
        return f"Edit {noun.lower()} “{self.resource.label(row)}”" if row is not None else f"New {noun.lower()}"

    note: ClassVar[str] = ""  # a line above the form

    def note_for(self, row: Any | None) -> str:
        return self.note

    def submit(self, row: Any | None) -> str:
        return "Save" if row is not None else self.new_submit

    def saved(self, request: HttpRequest, access: Access, row: Any | None, result: Any) -> HttpResponse | None:
        """After a save: a response of its own (e.g. a secret shown once), or None for the message."""
        self.resource.done(request, result, "saved" if row is not None else self.created)
        return None


def edit_page(editor: Editor) -> Callable[..., HttpResponse]:
    """The view for both the new and the edit URL of `editor`'s resource (pk absent: new)."""

    @org_view(manage=editor.manage)
    def view(request: HttpRequest, access: Access, pk: int | None = None) -> HttpResponse:
        editor.check(request, access)
        row = editor.get_row(access, pk) if pk else None
        form = editor.form(request.POST or None, access, row, request.GET)
        if request.method == "POST" and form.is_valid():
            try:
                result = editor.save(access, row, form)
            except (InvalidChange, NotAllowed) as exc:
                add_service_error(form, exc)
            else:
                return editor.saved(request, access, row, result) or redirect(
                    editor.resource.back, access.organization.slug
                )
        resource = editor.resource
        return render_org(
            request,
            access,
            "dashboard/form.html",
            resource.section,
            form=form,
            title=editor.title(row),
            submit=editor.submit(row),
            note=editor.note_for(row),
            delete_url=resource.delete_url if row is not None else None,
            obj=row,
        )

    return view


def delete_action(
    resource: Resource,
    service: Callable[..., Any],
    *,
    instance: str,
    verb: str = "deleted",
    manage: bool = True,
    check: Callable[[Access, Any], None] | None = None,
) -> Callable[..., HttpResponse]:
    """POST only: `service(<instance>=row, actor=...)` on the organization's row, then back to
    the list. `manage=False` with a `check` lets members act on their own rows (their keys)."""

    @require_POST
    @org_view(manage=manage)
    def view(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
        row = resource.row(access, pk)
        if check is not None:
            check(access, row)
        try:
            service(**{instance: row}, actor=access.actor)
        except (InvalidChange, NotAllowed) as exc:
            messages.error(request, exc.message)
        else:
            resource.done(request, row, verb)
        return redirect(resource.back, access.organization.slug)

    return view
