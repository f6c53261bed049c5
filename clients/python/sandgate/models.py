"""Typed models of the gateway's JSON, one dataclass per schema of api/openapi.yaml.

Each class names its schema in ``SCHEMA``; tests/test_models.py loads the yaml and checks
that every model's fields are exactly the schema's properties, so a field added to the API
fails the test until the SDK knows it.

Responses are parsed with ``from_dict`` (unknown keys are kept in ``extra_fields`` rather than
lost); requests are built by the clients from keyword arguments and sent with ``to_dict``,
which leaves out fields that were not given (None).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional


def _nested(model: str, many: bool = False, mapping: bool = False) -> Any:
    return field(default=None, metadata={"model": model, "many": many})


class Model:
    """Base of every model: conversion from and to the wire's JSON."""

    SCHEMA: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, data: dict) -> Any:
        if data is None:
            return None
        kwargs: dict[str, Any] = {}
        names = set()
        for f in dataclasses.fields(cls):
            if f.name == "extra_fields":
                continue
            wire = f.metadata.get("wire", f.name)
            names.add(wire)
            if wire not in data:
                continue
            v = data[wire]
            model = f.metadata.get("model")
            if model is not None and v is not None:
                m = MODELS[model]
                v = [m.from_dict(x) for x in v] if f.metadata.get("many") else m.from_dict(v)
            kwargs[f.name] = v
        obj = cls(**kwargs)
        obj.extra_fields = {k: v for k, v in data.items() if k not in names}
        return obj

    def to_dict(self) -> dict:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra_fields":
                continue
            v = getattr(self, f.name)
            if v is None:
                continue
            out[f.metadata.get("wire", f.name)] = _plain(v)
        return out


def _plain(v: Any) -> Any:
    if isinstance(v, Model):
        return v.to_dict()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _model(cls):
    """Registers cls as a keyword-only dataclass with an ``extra_fields`` dict."""
    cls.__annotations__["extra_fields"] = "dict"
    cls.extra_fields = field(default_factory=dict, repr=False, compare=False)
    cls = dataclass(kw_only=True)(cls)
    MODELS[cls.__name__] = cls
    return cls


MODELS: dict[str, type] = {}

# ---- requests ----------------------------------------------------------------


@_model
class Resources(Model):
    SCHEMA = "Resources"
    cpu: Optional[float] = None
    memory_mib: Optional[int] = None
    disk_gib: Optional[float] = None
    gpu: Optional[int] = None
    gpu_type: Optional[str] = None


@_model
class VolumeMount(Model):
    SCHEMA = "VolumeMount"
    mount_path: Optional[str] = None
    volume: Optional[str] = None
    host_path: Optional[str] = None
    read_only: Optional[bool] = None
    sub_path: Optional[str] = None


@_model
class Network(Model):
    """An egress policy: ``"none"``, ``"all"`` or ``{"allow": [...], "deny": [...]}``."""

    SCHEMA = "Network"
    egress: Any = None


@_model
class CreateSandbox(Model):
    SCHEMA = "CreateSandbox"
    image: Optional[str] = None
    ttl_s: Optional[float] = None
    idle_timeout_s: Optional[float] = None
    ready_timeout_s: Optional[float] = None
    workdir: Optional[str] = None
    env: Optional[dict] = None
    files: Optional[dict] = None
    metadata: Optional[dict] = None
    resources: Optional[Resources] = _nested("Resources")
    entrypoint: Optional[list] = None
    ports: Optional[list] = None
    network: Optional[Network] = _nested("Network")
    group: Optional[str] = None
    hostname: Optional[str] = None
    aliases: Optional[list] = None
    cap_add: Optional[list] = None
    provider_options: Optional[dict] = None
    snapshot_id: Optional[str] = None
    shm_size: Any = None
    volumes: Optional[list] = _nested("VolumeMount", many=True)
    count: Optional[int] = None
    allow_partial: Optional[bool] = None


@_model
class ExecRequest(Model):
    SCHEMA = "ExecRequest"
    command: Optional[str] = None
    cwd: Optional[str] = None
    env: Optional[dict] = None
    timeout_s: Optional[float] = None
    user: Optional[str] = None
    stdin_b64: Optional[str] = None
    preserve_background_services: Optional[bool] = None
    kill_on_disconnect: Optional[bool] = None


@_model
class CommandRequest(Model):
    SCHEMA = "CommandRequest"
    command: Optional[str] = None
    cwd: Optional[str] = None
    env: Optional[dict] = None
    timeout_s: Optional[float] = None
    user: Optional[str] = None
    stdin_b64: Optional[str] = None
    preserve_background_services: Optional[bool] = None
    max_output_bytes: Optional[int] = None


@_model
class SignalRequest(Model):
    SCHEMA = "SignalRequest"
    signal: Optional[str] = None


@_model
class UploadRequest(Model):
    SCHEMA = "UploadRequest"
    target_path: Optional[str] = None
    contents_b64: Optional[str] = None


@_model
class LeaseRequest(Model):
    SCHEMA = "LeaseRequest"
    scope: Optional[str] = None
    ttl_s: Optional[float] = None


@_model
class RenewRequest(Model):
    SCHEMA = "RenewRequest"
    ttl_s: Optional[float] = None


@_model
class SnapshotRequest(Model):
    SCHEMA = "SnapshotRequest"
    name: Optional[str] = None


@_model
class ForkRequest(Model):
    SCHEMA = "ForkRequest"
    count: Optional[int] = None


@_model
class CreateVolume(Model):
    SCHEMA = "CreateVolume"
    name: Optional[str] = None
    size_gib: Optional[float] = None


@_model
class PtyCreateRequest(Model):
    SCHEMA = "PtyCreateRequest"
    command: Optional[str] = None
    cwd: Optional[str] = None
    env: Optional[dict] = None
    user: Optional[str] = None
    rows: Optional[int] = None
    cols: Optional[int] = None
    pty: Optional[bool] = None


# ---- responses ---------------------------------------------------------------


@_model
class FieldError(Model):
    SCHEMA = "FieldError"
    field: Optional[str] = None
    message: Optional[str] = None


@_model
class Problem(Model):
    SCHEMA = "Problem"
    type: Optional[str] = None
    title: Optional[str] = None
    status: Optional[int] = None
    detail: Optional[str] = None
    code: Optional[str] = None
    errors: Optional[list] = _nested("FieldError", many=True)


@_model
class SandboxRef(Model):
    SCHEMA = "SandboxRef"
    server_url: Optional[str] = None
    sandbox_id: Optional[str] = None
    lease_token: Optional[str] = None
    provider_name: Optional[str] = None
    scope: Optional[str] = None
    workdir: Optional[str] = None
    extra: Optional[dict] = None


@_model
class BatchFailure(Model):
    SCHEMA = "BatchFailure"
    index: Optional[int] = None
    problem: Optional[Problem] = _nested("Problem")


@_model
class SandboxBatch(Model):
    SCHEMA = "SandboxBatch"
    sandboxes: Optional[list] = _nested("SandboxRef", many=True)
    failed: Optional[list] = _nested("BatchFailure", many=True)


@_model
class ForkResult(Model):
    SCHEMA = "ForkResult"
    sandboxes: Optional[list] = _nested("SandboxRef", many=True)


@_model
class SandboxInfo(Model):
    SCHEMA = "SandboxInfo"
    sandbox_id: Optional[str] = None
    status: Optional[str] = None
    group: Optional[str] = None
    hostname: Optional[str] = None
    aliases: Optional[list] = None
    network_address: Optional[str] = None
    hosts: Optional[dict] = None
    cap_add: Optional[list] = None
    status_reason: Optional[str] = None
    provider_name: Optional[str] = None
    workdir: Optional[str] = None
    created_at: Optional[str] = None
    expires_at: Optional[str] = None
    ttl_s: Optional[float] = None
    idle_timeout_s: Optional[float] = None
    last_activity_at: Optional[str] = None
    metadata: Optional[dict] = None
    ports: Optional[list] = None
    extra: Optional[dict] = None


@_model
class StatusResult(Model):
    SCHEMA = "StatusResult"
    status: Optional[str] = None
    status_reason: Optional[str] = None


@_model
class MetricSample(Model):
    SCHEMA = "MetricSample"
    time: Optional[str] = None
    cpu_count: Optional[int] = None
    cpu_used_pct: Optional[float] = None
    mem_used: Optional[int] = None
    mem_cache: Optional[int] = None
    mem_total: Optional[int] = None
    disk_used: Optional[int] = None
    disk_total: Optional[int] = None


@_model
class SandboxMetrics(Model):
    SCHEMA = "SandboxMetrics"
    samples: Optional[list] = _nested("MetricSample", many=True)


@_model
class ExecResult(Model):
    SCHEMA = "ExecResult"
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    return_code: Optional[int] = None
    error_type: Optional[str] = None
    duration_ms: Optional[int] = None
    truncated: Optional[bool] = None
    cpu_time_s: Optional[float] = None
    peak_memory_mib: Optional[float] = None
    oom_killed: Optional[bool] = None


@_model
class Command(Model):
    SCHEMA = "Command"
    command_id: Optional[str] = None
    command: Optional[str] = None
    running: Optional[bool] = None
    exit_code: Optional[int] = None
    error_type: Optional[str] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    duration_ms: Optional[int] = None
    cpu_time_s: Optional[float] = None
    peak_memory_mib: Optional[float] = None
    oom_killed: Optional[bool] = None
    stdout_size: Optional[int] = None
    stderr_size: Optional[int] = None
    truncated: Optional[bool] = None


@_model
class FileWritten(Model):
    SCHEMA = "FileWritten"
    path: Optional[str] = None
    size: Optional[int] = None


@_model
class FileInfo(Model):
    SCHEMA = "FileInfo"
    path: Optional[str] = None
    name: Optional[str] = None
    type: Optional[str] = None
    size: Optional[int] = None
    mode: Optional[str] = None
    modified_at: Optional[str] = None
    symlink_target: Optional[str] = None


@_model
class FileList(Model):
    SCHEMA = "FileList"
    path: Optional[str] = None
    entries: Optional[list] = _nested("FileInfo", many=True)
    truncated: Optional[bool] = None


@_model
class Snapshot(Model):
    SCHEMA = "Snapshot"
    snapshot_id: Optional[str] = None
    sandbox_id: Optional[str] = None
    name: Optional[str] = None
    size_bytes: Optional[int] = None
    created_at: Optional[str] = None


@_model
class ImageInfo(Model):
    SCHEMA = "ImageInfo"
    name: Optional[str] = None
    source: Optional[str] = None
    size_bytes: Optional[int] = None


@_model
class ImageList(Model):
    SCHEMA = "ImageList"
    provider_name: Optional[str] = None
    images: Optional[list] = _nested("ImageInfo", many=True)
    complete: Optional[bool] = None
    note: Optional[str] = None


@_model
class Volume(Model):
    SCHEMA = "Volume"
    volume_id: Optional[str] = None
    name: Optional[str] = None
    size_gib: Optional[float] = None
    created_at: Optional[str] = None
    mounted_by: Optional[list] = None


@_model
class LeaseInfo(Model):
    SCHEMA = "LeaseInfo"
    lease_id: Optional[str] = None
    scope: Optional[str] = None
    parent_id: Optional[str] = None
    created_at: Optional[str] = None
    expires_at: Optional[str] = None


@_model
class ReleaseResult(Model):
    SCHEMA = "ReleaseResult"
    released: Optional[bool] = None
    remaining_leases: Optional[int] = None


@_model
class RevokeResult(Model):
    SCHEMA = "RevokeResult"
    revoked: Optional[int] = None


@_model
class EndpointInfo(Model):
    SCHEMA = "EndpointInfo"
    endpoint: Optional[str] = None
    headers: Optional[dict] = None


@_model
class DeleteResult(Model):
    SCHEMA = "DeleteResult"
    deleted: Optional[bool] = None
    deferred: Optional[bool] = None


@_model
class PtyCreated(Model):
    SCHEMA = "PtyCreated"
    session_id: Optional[str] = None


@_model
class PtySession(Model):
    SCHEMA = "PtySession"
    session_id: Optional[str] = None
    running: Optional[bool] = None
    output_offset: Optional[int] = None
    exit_code: Optional[int] = None
    mode: Optional[str] = None
    attached: Optional[bool] = None
    created_at: Optional[str] = None


@_model
class QuotaLimits(Model):
    SCHEMA = "QuotaLimits"
    sandboxes: Optional[int] = None
    memory_mib: Optional[int] = None
    disk_gib: Optional[float] = None
    snapshots: Optional[int] = None
    snapshot_bytes: Optional[int] = None


@_model
class QuotaUsage(Model):
    SCHEMA = "QuotaUsage"
    sandboxes: Optional[int] = None
    queued: Optional[int] = None
    memory_mib: Optional[int] = None
    disk_gib: Optional[float] = None
    snapshots: Optional[int] = None
    snapshot_bytes: Optional[int] = None
    orphaned_snapshots: Optional[int] = None
    orphaned_snapshot_bytes: Optional[int] = None
    volumes: Optional[int] = None
    volume_gib: Optional[float] = None


@_model
class GatewayAdmission(Model):
    SCHEMA = "GatewayAdmission"
    max_sandboxes: Optional[int] = None
    sandboxes: Optional[int] = None
    queued: Optional[int] = None
    memory_mib: Optional[int] = None
    disk_gib: Optional[float] = None
    memory_budget_mib: Optional[int] = None
    disk_budget_gib: Optional[float] = None


@_model
class Quota(Model):
    SCHEMA = "Quota"
    limits: Optional[QuotaLimits] = _nested("QuotaLimits")
    usage: Optional[QuotaUsage] = _nested("QuotaUsage")
    gateway: Optional[GatewayAdmission] = _nested("GatewayAdmission")


def wire_fields(cls: type) -> set[str]:
    """The JSON member names of a model (what the schema's properties must be)."""
    return {f.metadata.get("wire", f.name) for f in dataclasses.fields(cls) if f.name != "extra_fields"}
