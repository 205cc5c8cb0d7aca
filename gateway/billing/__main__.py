"""`python -m gateway.billing > docs/billing.md`."""

from gateway.billing.docs import markdown

print(markdown(), end="")
