"""sandgate: Python client for the sandgate sandbox gateway.

    from sandgate import Client
    with Client("http://127.0.0.1:8080") as c:
        sb = c.create()
        print(sb.exec("echo hi").stdout)
        sb.delete()

Sync: Client, Sandbox, Terminal. Async: AsyncClient, AsyncSandbox, AsyncTerminal.
Errors: APIError and its subclasses carry the gateway's problem+json.
"""

from ._core import Batch, CommandEvent
from .aio import AsyncClient, AsyncSandbox
from .client import Client, Sandbox
from .errors import (APIError, AuthenticationError, BadRequestError, ConflictError, NotFoundError,
                     PayloadTooLargeError, PermissionDeniedError, RateLimitError, SandgateError, StreamError,
                     TakenOverError, UnavailableError)
from .models import (Command, CreateSandbox, ExecResult, FileInfo, FileList, LeaseInfo, Problem, PtySession,
                     Resources, SandboxInfo, SandboxRef, Snapshot, Volume, VolumeMount)
from .terminal import AsyncTerminal, Terminal

__version__ = "0.1.0"

__all__ = [
    "APIError", "AsyncClient", "AsyncSandbox", "AsyncTerminal", "AuthenticationError", "BadRequestError", "Batch",
    "Client", "Command", "CommandEvent", "ConflictError", "CreateSandbox", "ExecResult", "FileInfo", "FileList",
    "LeaseInfo", "NotFoundError", "PayloadTooLargeError", "PermissionDeniedError", "Problem", "PtySession",
    "RateLimitError", "Resources", "SandboxInfo", "SandboxRef", "Sandbox", "SandgateError", "Snapshot",
    "StreamError", "TakenOverError", "Terminal", "UnavailableError", "Volume", "VolumeMount",
]
