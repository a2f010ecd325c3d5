"""The GPU cloud's Python SDK (``from gpucloud import Client``) and its ``gpucloud`` command."""

from gpucloud.client import Client, LogsUnavailable
from gpucloud.errors import ApiError, AuthError, ConfigError, GpuCloudError, NotFound
from gpucloud.models import Account, ArrayJob, FileEntry, GpuType, Image, Instance, Job, LogEnd, LogLine, StatementLine

__all__ = [
    "Account", "ApiError", "ArrayJob", "AuthError", "Client", "ConfigError", "FileEntry", "GpuCloudError", "GpuType",
    "Image", "Instance", "Job", "LogEnd", "LogLine", "LogsUnavailable", "NotFound", "StatementLine",
]  # fmt: skip
