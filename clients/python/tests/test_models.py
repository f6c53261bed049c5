"""Every model's fields are exactly its schema's properties in api/openapi.yaml: a field the
API gains (or loses) fails here until the SDK knows it."""

import os
import pathlib

import pytest
import yaml

from sandgate import models

SPEC = pathlib.Path(os.environ.get("SANDGATE_OPENAPI") or pathlib.Path(__file__).parents[3] / "api" / "openapi.yaml")


@pytest.fixture(scope="module")
def schemas():
    with open(SPEC) as f:
        return yaml.safe_load(f)["components"]["schemas"]


def all_models():
    return sorted(models.MODELS.values(), key=lambda m: m.__name__)


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.__name__)
def test_model_matches_schema(model, schemas):
    assert model.SCHEMA in schemas, f"{model.__name__}: no schema {model.SCHEMA} in {SPEC}"
    props = set((schemas[model.SCHEMA].get("properties") or {}).keys())
    have = models.wire_fields(model)
    assert have == props, (f"{model.__name__} vs schema {model.SCHEMA}: missing in the SDK {sorted(props - have)}, "
                           f"not in the API {sorted(have - props)}")


def test_every_object_schema_has_a_model(schemas):
    """A new object schema with properties needs a model (or a line here saying why not)."""
    not_modelled = {"Health", "SignalResult", "UploadResult", "DownloadResult", "SandboxList", "CommandList",
                    "SnapshotList", "VolumeList", "LeaseList", "PtySessionList"}
    have = {m.SCHEMA for m in models.MODELS.values()}
    missing = sorted(n for n, s in schemas.items()
                     if s.get("properties") and n not in have and n not in not_modelled)
    assert not missing, f"schemas without a model: {missing}"


def test_nested_models_parse():
    b = models.SandboxBatch.from_dict({
        "sandboxes": [{"sandbox_id": "sbx-a", "lease_token": "t", "future_field": 1}],
        "failed": [{"index": 1, "problem": {"status": 503, "code": "unavailable", "errors": [{"field": "x", "message": "m"}]}}],
    })
    assert b.sandboxes[0].sandbox_id == "sbx-a"
    assert b.sandboxes[0].extra_fields == {"future_field": 1}
    assert b.failed[0].problem.errors[0].field == "x"


def test_requests_leave_out_unset_fields():
    req = models.CreateSandbox(image="x", resources=models.Resources(memory_mib=256),
                               volumes=[models.VolumeMount(volume="v", mount_path="/data")])
    assert req.to_dict() == {"image": "x", "resources": {"memory_mib": 256},
                             "volumes": [{"volume": "v", "mount_path": "/data"}]}
    with pytest.raises(TypeError):
        models.CreateSandbox(imagee="typo")


def test_the_installed_package_is_tested():
    """Under the Go test the package comes from `pip install` (SANDGATE_EXPECT_INSTALLED), not
    from the source tree, so the packaging is tested too."""
    import sandgate

    want = os.environ.get("SANDGATE_EXPECT_INSTALLED")
    if not want:
        pytest.skip("SANDGATE_EXPECT_INSTALLED is not set (not run by the Go test)")
    assert os.path.realpath(sandgate.__file__).startswith(os.path.realpath(want) + os.sep), sandgate.__file__
