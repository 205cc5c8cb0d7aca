"""Provider jobs: work a provider runs after the HTTP request that submitted it has ended
(batches, background responses, videos), and the batch input files they read.

A job's worst case is reserved at submission like any request's (one admission, under the
submitting request's id); then the reservation is handed to the job (`Reservation.job_id` set,
`owner` cleared, a job deadline) and beat renews its lease while the provider reports the job
alive. It is settled from the provider's final report, through the same usage record and drain
as a request (jobs/settle.py)."""

from django.db import models
from django.db.models import Q

from catalog.models import Connection, Model
from tenants.models import ApiKey, Organization


class JobFile(models.Model):
    """A file uploaded through capgate (POST /v1/files), kept so it is reachable only by the
    organization that uploaded it, on the connection that holds it. A batch input file also
    keeps what each of its lines may cost at most (`line_bounds`, nano-USD at the standard
    price, each line validated and bounded as the live request would be)."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    file_id = models.CharField(max_length=200)  # the provider's id, as the client sees it
    connection = models.ForeignKey(Connection, on_delete=models.SET_NULL, null=True, related_name="+")
    purpose = models.CharField(max_length=50)
    filename = models.CharField(max_length=255, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    # Batch input files: the endpoint kind every line calls (chat | responses | embeddings), the
    # route (capgate model name) and catalog model its lines were priced at, one bound per line.
    kind = models.CharField(max_length=20, blank=True)
    route = models.CharField(max_length=200, blank=True)
    model = models.ForeignKey(Model, on_delete=models.SET_NULL, null=True, related_name="+")
    line_count = models.PositiveIntegerField(default=0)
    line_bounds = models.JSONField(default=list, blank=True)
    # {custom_id: catalog model id} when its lines run on more than one model ({} when they share
    # `model`): a batch of it settles each line's usage at that line's own model.
    line_models = models.JSONField(default=dict, blank=True)
    # Why a blocking cap cannot admit a batch of this file ("" if it can): a refused field or an
    # unpriced model, as the 402 code a live request would get.
    refused_code = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "file_id"], name="job_file_unique_per_org"),
        ]


class Job(models.Model):
    class Kind(models.TextChoices):
        BATCH = "batch"  # OpenAI /v1/batches
        MESSAGE_BATCH = "message_batch"  # Anthropic /v1/messages/batches
        RESPONSE = "response"  # OpenAI background response
        VIDEO = "video"  # OpenAI /v1/videos

    class State(models.TextChoices):
        LIVE = "live"  # the provider reports it running; its hold is renewed
        CANCELLING = "cancelling"  # cancel requested: the hold stays until the final report
        ESTIMATED = "estimated"  # gone or lapsed without a final report: charged at worst case
        SETTLED = "settled"  # settled (or corrected) from the provider's final report

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    provider_job_id = models.CharField(max_length=200)
    connection = models.ForeignKey(Connection, on_delete=models.SET_NULL, null=True, related_name="+")
    model = models.ForeignKey(Model, on_delete=models.SET_NULL, null=True, related_name="+")
    route = models.CharField(max_length=200, blank=True)  # the model name the caller used
    api_key = models.ForeignKey(ApiKey, on_delete=models.SET_NULL, null=True, related_name="+")
    # The id of the request that submitted it: its reservation and, once settled, its usage record
    # (so the request log links the job to the request that created it).
    request_id = models.CharField(max_length=100, unique=True)
    worst_nano = models.BigIntegerField()
    input_file_id = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.LIVE)
    provider_status = models.CharField(max_length=50, blank=True)  # as the provider last said
    cost_nano = models.BigIntegerField(null=True, blank=True)  # what it was settled at
    detail = models.JSONField(default=dict, blank=True)  # e.g. a video's seconds, a batch's line count
    # A batch whose lines run on more than one model: {custom_id: catalog model id}, each line's
    # usage priced at its own model (jobs/settle.py). {}: every line is priced at `model`.
    line_models = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    deadline_at = models.DateTimeField()  # the hold is never renewed past it
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    next_poll_at = models.DateTimeField()
    polls = models.PositiveIntegerField(default=0)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "kind", "provider_job_id"], name="job_unique_per_org"),
            models.CheckConstraint(condition=Q(worst_nano__gte=0), name="job_worst_nonnegative"),
        ]
        indexes = [
            models.Index(fields=["state", "next_poll_at"]),
            models.Index(fields=["organization", "-id"]),
            # An organization's live jobs, counted at every submission (jobs/quotas.py) among
            # however many settled ones it keeps.
            models.Index(fields=["organization", "state"]),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.provider_job_id}"


class JobSubmission(models.Model):
    """A job being submitted: it holds one of its organization's live-job slots from admission
    until its Job row exists (start_job deletes it in the same transaction) or the submission
    ends without one (jobs/quotas.py). A row left by a process that died stops counting once its
    reservation is gone and it is older than a lease."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    request_id = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["organization", "created_at"])]
