"""The security tests reuse the gateway's live server and tenant, and the API's cast."""

from tests.api.conftest import org_a, org_b, role_users  # noqa: F401  (fixtures)
from tests.gateway.conftest import gateway, upstream, wired  # noqa: F401  (fixtures)
