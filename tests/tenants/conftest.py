"""The tenants tests share the API's cast (acme with every role, and globex, the outsider)."""

from tests.api.conftest import org_a, org_b, role_users  # noqa: F401
