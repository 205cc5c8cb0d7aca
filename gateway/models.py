"""What the gateway remembers between requests: the Responses API's stored state."""

from django.db import models

from catalog.models import Connection
from tenants.models import Organization


class StoredResponse(models.Model):
    """A response capgate relayed, so a later `previous_response_id` or `conversation` can be
    bounded (the provider adds that context; the request body does not show it) and so GET,
    DELETE and cancel reach only the organization that owns it, on the connection that served it.

    `context_tokens` is what the provider will add when a request continues from this response:
    its input (which already held every earlier turn) plus its output."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    response_id = models.CharField(max_length=200)
    conversation_id = models.CharField(max_length=200, null=True, blank=True)
    connection = models.ForeignKey(Connection, on_delete=models.SET_NULL, null=True, related_name="+")
    context_tokens = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "response_id"], name="stored_response_unique_per_org"),
            models.CheckConstraint(
                condition=models.Q(context_tokens__gte=0), name="stored_response_tokens_nonnegative"
            ),
        ]
        indexes = [
            models.Index(fields=["organization", "conversation_id", "-id"]),
            # retention deletes by age (gateway/retention.py)
            models.Index(fields=["created_at"], name="stored_response_created_idx"),
        ]


class ConversationTurn(models.Model):
    """A turn of a Responses `conversation` in flight under a blocking budget: at most one per
    conversation (gateway/upstream/continuations.py). The provider adds every item a turn writes to
    the conversation, so a turn bounded by the conversation's stored context must not run beside
    another turn that may grow it. Deleted when the turn ends; a row whose `expires_at` passed
    (its process died) no longer holds the conversation."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    conversation_id = models.CharField(max_length=200)
    request_id = models.CharField(max_length=64)
    # The gateway process running the turn: a claim of a process that stopped heartbeating is
    # taken over, as its reservations are expired (ledger/admission.py).
    owner = models.ForeignKey("ledger.GatewayInstance", on_delete=models.SET_NULL, null=True, related_name="+")
    # What the conversation may hold once this turn ends (its context, input and output bounds),
    # set once admitted: a turn that ends unremembered, or whose process died, leaves it behind.
    bound_tokens = models.BigIntegerField(null=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "conversation_id"], name="one_turn_per_conversation"),
        ]
