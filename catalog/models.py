"""The price catalog and each organization's upstream connections and routes.

Prices are Decimal USD per 1M tokens; converting them to nano-USD happens only in
catalog/pricing.py.
"""

import base64
import functools
import hashlib
from decimal import Decimal

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.expressions import Combinable

from core.env import env
from tenants.models import Organization


def price_field() -> "models.DecimalField[str | float | Decimal | Combinable | None, Decimal | None]":
    """A USD-per-1M-tokens price; null means not priced. A function rather than a `**dict`
    spread so the type checker sees the field's arguments and its nullable value type."""
    return models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)


ENCRYPTED_PREFIX = "enc:v1:"


@functools.cache
def _fernet() -> MultiFernet:
    """Keys from CAPGATE_SECRET_KEY (comma-separated: the first encrypts, all decrypt, so a key
    can be rotated). A value that is not a Fernet key is stretched into one; with no variable at
    all the key is derived from DJANGO_SECRET_KEY, so development works out of the box."""
    raw = [k.strip() for k in env("CAPGATE_SECRET_KEY", default="").split(",") if k.strip()]
    if not raw:
        raw = ["django:" + settings.SECRET_KEY]
    keys = []
    for k in raw:
        try:
            keys.append(Fernet(k))
        except ValueError:
            keys.append(Fernet(base64.urlsafe_b64encode(hashlib.sha256(k.encode()).digest())))
    return MultiFernet(keys)


def encrypt_secret(plain: str) -> str:
    if not plain:
        return ""
    return ENCRYPTED_PREFIX + _fernet().encrypt(plain.encode()).decode()


def decrypt_secret(stored: str) -> str:
    if not stored.startswith(ENCRYPTED_PREFIX):
        return stored  # written before encryption existed (the migration encrypts those)
    try:
        return _fernet().decrypt(stored[len(ENCRYPTED_PREFIX) :].encode()).decode()
    except InvalidToken as exc:
        raise ValueError("connection secret cannot be decrypted: wrong CAPGATE_SECRET_KEY?") from exc


class EncryptedTextField(models.TextField):
    """Plain text in Python, Fernet ciphertext in the database (encrypted at rest)."""

    def from_db_value(self, value, expression, connection):
        return value if value is None else decrypt_secret(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value is None else encrypt_secret(value)


class Provider(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.name


# Encodings gateway/admission/tokens.py can count with (tiktoken's names).
TOKENIZERS = [("o200k_base", "o200k_base"), ("cl100k_base", "cl100k_base")]


class Model(models.Model):
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    input_usd_per_mtok = price_field()
    output_usd_per_mtok = price_field()
    cache_read_usd_per_mtok = price_field()
    cache_write_usd_per_mtok = price_field()
    # Anthropic's 1-hour cache writes (cache_control ttl "1h"); null: refused under a blocking cap.
    cache_write_1h_usd_per_mtok = price_field()
    per_request_usd = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    # Paid features beyond tokens (docs/billing.md). Null means "not priced": a request that asks
    # for the feature is refused under a blocking cap, never admitted at zero.
    web_search_usd_per_use = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    # Upper bound on the input tokens one server-side tool use (a web search's results) adds to
    # the context the provider bills; the request body cannot show them.
    server_tool_result_tokens = models.PositiveIntegerField(null=True, blank=True)
    # service_tier prices as multipliers of every token rate (OpenAI priority/fast, flex).
    priority_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    flex_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    # Anthropic's fast mode (`speed: "fast"`): every token rate times this, on top of any service
    # tier. Null: not priced, so a fast request is refused under a blocking cap.
    fast_mode_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    # Long-context band: above this many input tokens every input-side rate is multiplied by the
    # input multiplier and the output rate by the output multiplier (for the whole request).
    long_context_threshold_tokens = models.PositiveIntegerField(null=True, blank=True)
    long_context_input_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    long_context_output_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    # Prompt-size tiers as the provider lists them, ascending: [{"above_input_tokens": 200000,
    # "input": "2.5", "output": "15", "cache_read": "0.25", ...}] (Decimal strings, USD per 1M
    # tokens). Above a threshold every token of the request is billed at that tier's rates; a rate
    # a tier does not list stays the base rate. Validated by catalog.fields.PriceTierField.
    price_tiers = models.JSONField(default=list, blank=True)
    # Batch APIs (OpenAI /v1/batches, Anthropic message batches) bill every token rate at this
    # multiple of the standard price (0.5 for both today). Null: batches are bounded and billed at
    # the standard price, which is never below the batch price.
    batch_multiplier = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    # Video generation (OpenAI /v1/videos) is billed per second of output. Null: not priced, so a
    # video is refused under a blocking cap.
    video_usd_per_second = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    context_window = models.PositiveIntegerField(null=True, blank=True)
    # Upper bound on the tokens one image part can cost (the provider's tile formula at the
    # largest accepted size). Null: images cannot be bounded, so they are refused under a cap.
    max_image_tokens = models.PositiveIntegerField(null=True, blank=True)
    # The public encoding the provider counts this model's prompt tokens with; null: unknown,
    # so the prompt is bounded by its bytes (gateway/admission/tokens.py).
    tokenizer = models.CharField(max_length=20, null=True, blank=True, choices=TOKENIZERS)
    prices_as_of = models.DateField(null=True, blank=True)
    # What the price catalog last said for each field it loads (catalog key -> JSON value). A
    # field whose value differs from it was edited by an operator, so a reload keeps it; null: the
    # row predates this record, and a reload keeps every difference (--overwrite replaces them).
    catalog_values = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="model_unique_per_provider"),
        ]
        for field in ("input", "output", "cache_read", "cache_write", "cache_write_1h"):
            constraints.append(
                models.CheckConstraint(
                    condition=Q(**{f"{field}_usd_per_mtok__isnull": True}) | Q(**{f"{field}_usd_per_mtok__gte": 0}),
                    name=f"model_{field}_price_nonnegative",
                )
            )
        del field

    def __str__(self) -> str:
        return f"{self.provider.slug}/{self.name}"

    @property
    def is_priced(self) -> bool:
        return self.input_usd_per_mtok is not None and self.output_usd_per_mtok is not None


class Connection(models.Model):
    """An organization's upstream: where requests go, with which secret, at which rates."""

    class Kind(models.TextChoices):
        OPENAI = "openai"
        ANTHROPIC = "anthropic"
        # Azure OpenAI: deployment URLs and api-version (options), an api-key or an Entra token.
        AZURE_OPENAI = "azure_openai"
        # The Gemini API's OpenAI-compatible endpoint, with a Gemini API key as the bearer token.
        GEMINI = "gemini"
        # Amazon Bedrock (Claude's Messages body on InvokeModel), signed with SigV4.
        BEDROCK = "bedrock"
        # Google Vertex AI (Claude's rawPredict, Gemini's OpenAI-compatible endpoint), with a
        # service account's OAuth token.
        VERTEX = "vertex"
        # OpenAI-compatible providers: base URL, headers and model naming from catalog/presets.py.
        GROQ = "groq"
        MISTRAL = "mistral"
        DEEPSEEK = "deepseek"
        XAI = "xai"
        TOGETHER = "together"
        FIREWORKS = "fireworks"
        OPENROUTER = "openrouter"
        VLLM = "vllm"
        OLLAMA = "ollama"
        ECHO = "echo"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="connections")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    base_url = models.URLField(blank=True)
    # Encrypted at rest; never rendered back by the dashboard or the API (write-only).
    secret = EncryptedTextField(blank=True)
    # Negotiated rates override the catalog's list price for this organization.
    input_usd_per_mtok = price_field()
    output_usd_per_mtok = price_field()
    cache_read_usd_per_mtok = price_field()
    cache_write_usd_per_mtok = price_field()
    # echo: {"delay_ms", "chunks", "prompt_tokens", "completion_tokens", "text"}
    # azure_openai: {"api_version": "2024-10-21", "auth": "api_key" | "entra",
    #                "deployments": {"<catalog model name>": "<deployment name>"}}
    # gemini: none needed; base_url defaults to https://generativelanguage.googleapis.com/v1beta/openai/
    # bedrock: {"region": "us-east-1", "profile"?: "<AWS profile>"}; the secret is
    #          {"access_key_id", "secret_access_key", "session_token"?} (or empty: the chain)
    # vertex: {"project": "<project id>", "region": "us-east5" | "global"}; the secret is a
    #         service account's JSON key
    # openrouter: {"app_url"?, "app_name"?} (attribution headers)
    # any kind: {"model_ids": {"<catalog model name>": "<the provider's id>"}}
    options = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="connection_name_unique_per_org"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def plain_secret(self) -> str:
        """The upstream credential as sent to the provider (the gateway's only way to read it)."""
        return self.secret

    def provider_model_id(self, model_name: str) -> str:
        """The id the provider knows a catalog model by on this connection: its own mapping
        (options.model_ids, catalog name -> provider id), else the catalog's name. What the
        provider bills is the model it is sent, so pricing reads the same id."""
        mapped = (self.options.get("model_ids") or {}).get(model_name)
        return mapped if isinstance(mapped, str) and mapped else model_name


class Route(models.Model):
    """A model name an organization calls, mapped to ordered (connection, model) targets."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="routes")
    name = models.CharField(max_length=200)
    # Output ceiling sent upstream when a request names none (see ApiKey.default_max_output_tokens).
    default_max_output_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="route_name_unique_per_org"),
        ]

    def __str__(self) -> str:
        return self.name


class RouteTarget(models.Model):
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="targets")
    connection = models.ForeignKey(Connection, on_delete=models.CASCADE, related_name="route_targets")
    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="route_targets")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["route", "position"], name="route_target_position_unique"),
        ]


class Classification(models.Model):
    """The deployment operator's class for a request field, tool type, Anthropic beta or provider
    header the billing inventory (gateway/billing/) does not list, for one endpoint: for every
    organization (organization null) or for one, which then wins over the deployment's. The
    gateway reads these on each request (through its lookup cache), so a new client version's
    additions are unblocked without a release. Written only by catalog/classifications.py."""

    class What(models.TextChoices):
        FIELD = "field"
        TOOL = "tool"
        BETA = "beta"
        HEADER = "header"

    class Cls(models.TextChoices):
        FREE = "free"  # cannot change the bill
        TOKENS = "tokens"  # bounded by the input bytes and the output ceiling
        REFUSED = "refused"  # refused under a blocking cap, passed where none applies

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, null=True, blank=True, related_name="classifications"
    )
    endpoint = models.CharField(max_length=20)  # chat | messages | responses | embeddings
    what = models.CharField(max_length=10, choices=What.choices)
    name = models.CharField(max_length=200)
    cls = models.CharField(max_length=10, choices=Cls.choices)
    reason = models.TextField()
    updated_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "endpoint", "what", "name"],
                nulls_distinct=False,
                name="classification_unique_per_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.what} {self.name}: {self.cls}"


class ClassificationChange(models.Model):
    """The audit trail of classifications, deployment-wide ones included (the organization audit
    log needs an organization). Rows outlive what they describe: names, not references."""

    organization_slug = models.CharField(max_length=100, blank=True)  # "": the deployment
    endpoint = models.CharField(max_length=20)
    what = models.CharField(max_length=10)
    name = models.CharField(max_length=200)
    cls_before = models.CharField(max_length=10, blank=True)  # "": newly classified
    cls_after = models.CharField(max_length=10)
    reason = models.TextField()
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
