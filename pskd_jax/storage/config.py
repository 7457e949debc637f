"""How the toolkit reaches an object store: configuration as the providers' own tools read it,
an explicit options value for who wants one, and a client made once per bucket.

- S3 (and S3-compatible stores): the standard variables (``AWS_ENDPOINT_URL``,
  ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
  ``AWS_ALLOW_HTTP=true`` for a plain-HTTP endpoint), and with ``AWS_PROFILE`` (or no keys in the
  environment) the profile's entries of ``~/.aws/credentials`` and ``~/.aws/config``;
  otherwise the client's own chain (instance and container roles, web identity).
- GCS: application default credentials, as the client finds them; ``STORAGE_EMULATOR_HOST``
  points it at an emulator (no signing).
- :class:`StorageOptions` overrides any of it, and sets retries and concurrency.

Credentials never appear in a message: :func:`redact` removes every secret the options or the
environment hold from the text of an error before it is shown. The client (obstore) is an
optional extra: an object URL without it is E9018 saying what to install.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from pskd_jax._os.checks import checked_integer
from pskd_jax.errors import StorageError, UsageError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, GCSConfig, RetryConfig, S3Config  # (its stubs' names only)

EXTRA = "pskd_jax[storage]"  # the optional extra that installs the client
# The access key's id is no secret, but it names the account: it is kept out of messages too, as
# the environment's AWS_ACCESS_KEY_ID is.
_SECRET_KEYS = ("secret_access_key", "session_token", "token", "bearer_token", "service_account_key",
                "aws_secret_access_key", "aws_session_token", "access_key_id", "aws_access_key_id")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """How to reach object stores, when the environment is not enough.

    ``config``: the client's store settings, which win over the environment (for S3:
    ``endpoint``, ``region``, ``access_key_id``, ``secret_access_key``, ``session_token``; for
    GCS: ``service_account``, ``base_url``, …). ``allow_http``: accept a plain-HTTP endpoint (a
    local server). ``retries``: how many times a throttled (429, 503) or dropped request is tried
    again, with exponential backoff, before E9018; ``retry_seconds`` bounds the whole of one
    request's retries; ``backoff_seconds``: the first pause, doubled at each retry up to 5 s.
    ``concurrency``: requests in flight for one read or write; ``part_bytes``: the size of each
    ranged read and upload part.

    >>> StorageOptions(config={"secret_access_key": "hunter2"})  # doctest: +NORMALIZE_WHITESPACE
    StorageOptions(config={'secret_access_key': '***'}, allow_http=None, retries=5, retry_seconds=60.0,
                   concurrency=16, part_bytes=8388608, backoff_seconds=0.1)
    """

    config: Mapping[str, str] = dataclasses.field(default_factory=dict)
    allow_http: bool | None = None
    retries: int = 5
    retry_seconds: float = 60.0
    concurrency: int = 16
    part_bytes: int = 8 << 20
    backoff_seconds: float = 0.1  # (last, so that the fields before it keep their places)

    def __post_init__(self) -> None:
        if not isinstance(self.config, Mapping) or not all(isinstance(k, str) for k in self.config):
            raise UsageError(f"config={type(self.config).__name__}: expected a mapping of setting names to values")
        object.__setattr__(self, "config", dict(self.config))
        checked_integer(self.retries, "retries", low=0, high=100)
        checked_integer(self.concurrency, "concurrency", low=1, high=1024)
        checked_integer(self.part_bytes, "part_bytes", low=1 << 16, high=1 << 32)
        if not _seconds(self.retry_seconds) or not 0 < self.retry_seconds <= 3600:
            raise UsageError(f"retry_seconds={self.retry_seconds!r}: expected a number of seconds in (0, 3600]")
        if not _seconds(self.backoff_seconds) or not 0 < self.backoff_seconds <= 5:
            raise UsageError(f"backoff_seconds={self.backoff_seconds!r}: expected a number of seconds in (0, 5]")
        if self.allow_http is not None and not isinstance(self.allow_http, bool):
            raise UsageError(f"allow_http={self.allow_http!r}: expected True, False or None (the environment's)")

    def __repr__(self) -> str:
        shown = {k: ("***" if k.lower() in _SECRET_KEYS else v) for k, v in self.config.items()}
        return (f"StorageOptions(config={shown!r}, allow_http={self.allow_http!r}, retries={self.retries!r}, "
                f"retry_seconds={self.retry_seconds!r}, concurrency={self.concurrency!r}, "
                f"part_bytes={self.part_bytes!r}, backoff_seconds={self.backoff_seconds!r})")

    def __hash__(self) -> int:
        # Options are values: equal ones (the dataclass's field-by-field equality) hash alike, so
        # that they can key what is made once for them (a bucket's client). The settings' names
        # stand for the mapping (its values may be anything, and equal values can hash apart).
        return hash((tuple(sorted(self.config)), self.allow_http, self.retries, self.retry_seconds,
                     self.concurrency, self.part_bytes, self.backoff_seconds))

    def secrets(self) -> list[str]:
        return [str(v) for k, v in self.config.items() if k.lower() in _SECRET_KEYS and v]


def _seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


DEFAULT_OPTIONS = StorageOptions()


def redact(text: str, options: StorageOptions = DEFAULT_OPTIONS) -> str:
    """``text`` with every credential the options, the environment and the AWS profile files hold
    replaced by ``***`` (a server's error page may repeat the request's headers, which carry the
    key's id and the session token, wherever the client found them)."""
    try:
        profile = [v for k, v in aws_profile_config().items() if k in _SECRET_KEYS]
    except StorageError:  # (a profile file that does not read: the client could not have used it)
        profile = []
    for secret in [*options.secrets(), *(os.environ.get(name, "") for name in _SECRET_VARIABLES), *profile]:
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def aws_profile_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The S3 settings of the AWS profile (``AWS_PROFILE``, else ``default``) from the shared files,
    when the profile is asked for or the environment holds no keys; empty otherwise.

    >>> aws_profile_config({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    {}
    """
    environ = os.environ if environ is None else environ
    profile = environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE")
    if not profile and environ.get("AWS_ACCESS_KEY_ID"):
        return {}
    profile = profile or "default"
    home = os.path.expanduser("~")
    found: dict[str, str] = {}
    credentials = environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials")
    settings = environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config")
    for path, section in ((settings, profile if profile == "default" else f"profile {profile}"),
                          (credentials, profile)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError) as e:
            raise StorageError(f"{path}: cannot read the AWS profile {profile!r}: {type(e).__name__}") from None
        if parser.has_section(section):
            found.update({k.lower(): v for k, v in parser.items(section)})
    names = {"aws_access_key_id": "access_key_id", "aws_secret_access_key": "secret_access_key",
             "aws_session_token": "session_token", "region": "region", "endpoint_url": "endpoint"}
    return {ours: found[theirs] for theirs, ours in names.items() if found.get(theirs)}


def s3_settings(options: StorageOptions, environ: Mapping[str, str] | None = None) -> tuple[dict, dict]:
    """The store config and client options of an S3 store: the profile's, then the options'."""
    environ = os.environ if environ is None else environ
    config = aws_profile_config(environ)
    config.update(options.config)
    client: dict[str, Any] = {}
    allow = options.allow_http if options.allow_http is not None else _truthy(environ.get("AWS_ALLOW_HTTP"))
    if allow:
        client["allow_http"] = True
    return config, client


def gcs_settings(options: StorageOptions, environ: Mapping[str, str] | None = None) -> tuple[dict, dict]:
    """The store config and client options of a GCS store (an emulator when STORAGE_EMULATOR_HOST
    is set).

    For an emulator, requests go unsigned to its address. The client honours ``skip_signature``
    for reads only: its writes and deletes still ask for a token, from the metadata server of a
    cloud machine when nothing else is configured (a request to 169.254.169.254 that fails, and
    must not be made, off the cloud). A service-account key that disables OAuth gives them an
    empty token instead, which is what an emulator expects (the key holds no secret).
    """
    environ = os.environ if environ is None else environ
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    emulator = environ.get("STORAGE_EMULATOR_HOST")
    if emulator:
        config["base_url"] = (emulator if "://" in emulator else f"http://{emulator}").rstrip("/")
        config["skip_signature"] = True
        config["service_account_key"] = _EMULATOR_KEY
        client["allow_http"] = True
    config.update(options.config)
    if options.allow_http is not None:
        client["allow_http"] = options.allow_http
    return config, client


# A service-account key of no account: the client's tokens for an emulator are empty strings.
_EMULATOR_KEY = ('{"client_email": "emulator@localhost", "private_key": "", "private_key_id": "", '
                 '"disable_oauth": true}')


def obstore_module() -> Any:
    """The client library, or E9018 saying which extra installs it."""
    try:
        import obstore
    except ImportError:
        raise StorageError(f"object-store URLs need the obstore client: pip install '{EXTRA}'") from None
    return obstore


_MEMORY: dict[str, Any] = {}  # memory:// stores by name: one process's, shared by every opening
_MEMORY_LOCK = threading.Lock()


def memory_store(name: str) -> Any:
    """The process's in-memory store called ``name`` (made on first use)."""
    obstore_module()
    from obstore.store import MemoryStore

    with _MEMORY_LOCK:
        if name not in _MEMORY:
            _MEMORY[name] = MemoryStore()
        return _MEMORY[name]


def retry_config(options: StorageOptions) -> RetryConfig:
    import datetime

    return {"max_retries": options.retries,
            "retry_timeout": datetime.timedelta(seconds=options.retry_seconds),
            "backoff": {"init_backoff": datetime.timedelta(seconds=options.backoff_seconds),
                        "max_backoff": datetime.timedelta(seconds=5), "base": 2}}


def client_store(scheme: str, bucket: str, options: StorageOptions) -> Any:
    """A client store of obstore for ``scheme://bucket`` with these options."""
    obstore_module()
    if scheme == "memory":
        return memory_store(bucket)
    from obstore.store import GCSStore, S3Store

    # The settings' keys come from the user's options: obstore checks them when the store is made.
    if scheme == "s3":
        config, client = s3_settings(options)
        return S3Store(bucket, config=cast("S3Config", config),
                       client_options=cast("ClientConfig | None", client or None), retry_config=retry_config(options))
    if scheme == "gs":
        config, client = gcs_settings(options)
        return GCSStore(bucket, config=cast("GCSConfig", config),
                        client_options=cast("ClientConfig | None", client or None), retry_config=retry_config(options))
    raise StorageError(f"{scheme}://{bucket}: no object-store client for {scheme}://")


__all__ = ["DEFAULT_OPTIONS", "EXTRA", "StorageOptions", "aws_profile_config", "client_store", "gcs_settings",
           "memory_store", "obstore_module", "redact", "retry_config", "s3_settings"]
