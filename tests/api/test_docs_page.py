import pytest

pytestmark = pytest.mark.django_db


def test_api_docs_page_serves_swagger_ui_without_a_cdn(client):
    page = client.get("/api/docs/").content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn" not in page.lower()
    assert client.get("/api/schema/").status_code == 200
