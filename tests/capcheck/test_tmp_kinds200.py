import pytest

from tests.capcheck.test_kinds import capcheck, kind_args

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("kind", ["bedrock", "vertex", "groq", "azure_openai", "gemini"])
def test_200(gateway, upstream, monkeypatch, kind):
    extra = kind_args(kind, upstream, monkeypatch)
    if kind == "azure_openai":
        extra[3] = upstream.url
    if kind == "gemini":
        extra[3] = upstream.url + "/v1beta/openai/"
    out, error = capcheck(gateway, "--concurrency", "200", *extra)
    with open(f"/tmp/prov_capcheck_{kind}.txt", "w") as f:
        f.write(out)
    assert error is None, out
    assert "4 of 4 runs hold all four properties" in out
