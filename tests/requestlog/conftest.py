"""The request log's tests use the gateway's live server and tenant, and the API's cast."""

from tests.api.conftest import org_a, org_b, role_users  # noqa: F401
from tests.gateway.conftest import gateway, upstream, wired  # noqa: F401
