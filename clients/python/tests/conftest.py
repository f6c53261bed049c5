"""The SDK's tests run against a real gateway: SANDGATE_URL (and SANDGATE_API_KEY when it has
keys). SANDGATE_IMAGE is the image to create from (docker needs one). Without SANDGATE_URL only
the offline tests (models against the OpenAPI document) run. The Go test
cmd/gateway/pysdk_e2e_test.go starts gateways on local and docker and runs these."""

import os
import uuid

import pytest

import sandgate

URL = os.environ.get("SANDGATE_URL")


def pytest_collection_modifyitems(config, items):
    if URL:
        return
    skip = pytest.mark.skip(reason="SANDGATE_URL is not set: no gateway to test against")
    for item in items:
        if "gateway" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gateway: needs a running gateway (SANDGATE_URL)")


@pytest.fixture(scope="session")
def image():
    return os.environ.get("SANDGATE_IMAGE") or None


@pytest.fixture(scope="session")
def provider():
    return os.environ.get("SANDGATE_PROVIDER", "local")


@pytest.fixture
def client():
    with sandgate.Client() as c:
        yield c


@pytest.fixture
def tag():
    """A label unique to one test, to find its sandboxes in a list."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def make(client, image):
    """Creates sandboxes of the test image and deletes them at the end."""
    made = []

    def make(**fields):
        fields.setdefault("image", image)
        sb = client.create(**fields)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        try:
            sb.delete()
        except sandgate.NotFoundError:
            pass


def pytest_collection_finish(session):
    pass
