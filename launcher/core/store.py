"""An S3-compatible object store as a run reads and writes its data there: ``data.path=s3://BUCKET/PREFIX``.

One client for the launcher's checks, ``launcher data prepare``, and the tasks that stream a dataset
(launcher/train/shard_cache.py). It is botocore's (boto3's), loaded only here and only when a bucket is used, so
the launcher and a run on local data never import it. botocore resolves an endpoint, a region, an addressing style
and credentials exactly as the AWS CLI does (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, the shared
config and credentials files), so a user whose ``aws s3 ls`` works needs nothing more; a site's own store is set
in its cluster file (``cluster.store``), a run's in ``data.store``, and the launch writes what it resolved into the
run's config, so that every task reaches the store the login node checked (:func:`resolve`).

Credentials are never config. A task finds them where botocore looks (the secrets store injects
``AWS_ACCESS_KEY_ID`` and friends, or ``AWS_SHARED_CREDENTIALS_FILE``, before training starts), or, when the user
had them only in their login shell, in a 0600 file of the secrets store the launch wrote for the run
(:data:`CREDENTIALS_FILE`); Slurm never carries them (:data:`CREDENTIAL_VARIABLES` are kept out of sbatch's
environment by launcher/slurm/client.py).

Every request goes through one retry loop (:meth:`Store.retrying`): 429, 5xx (503 SlowDown), a reset, a refused
connection, a body cut short and a transfer that stalls (less than :data:`STALL_BYTES` in ``stall_s``) are tried
again after a jittered exponential backoff (full jitter: a random wait up to ``min(cap, base * 2**try)``, so that
many ranks throttled together do not come back together), resuming a download where it got to with a Range request
held to the object's ETag (If-Match), until ``retry_s`` seconds are spent: then :class:`StoreError`, whose message
names the object and the endpoint, and whose fault is the store's (retried as such, no node blamed). A missing
object, a refused credential or a missing bucket is not retried: the same on every try.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Tuple

from launcher.core.events import Fault

if TYPE_CHECKING:  # the config module loads omegaconf, which a status command that asks Slurm does not need
    from launcher.core.config import StoreConfig

SCHEME = "s3://"
# What botocore takes credentials from in a process's environment: never handed to Slurm (sbatch would keep them in
# the job's environment, which the controller stores and sacct shows), never written by the launcher.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
# The variables of the secrets store that give the tasks credentials of their own (the launch then keeps none).
STORE_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE",
                     "AWS_CONTAINER_CREDENTIALS_FULL_URI")
# Where a task finds the credentials its launch captured (a path in the secrets store, set by launcher/job/entry.py).
CREDENTIALS_FILE = "LAUNCHER_STORE_CREDENTIALS"
ADDRESSING = ("auto", "path", "virtual")
STALL_BYTES = 1 << 20  # a transfer that delivers less than this in stall_s seconds is cut and tried again
CHUNK = 64 << 10  # a body is read this much at a time: a trickle is seen within stall_s (or this at its rate)
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.2, 20.0
RETRIED_STATUS = {408, 429, 500, 502, 503, 504}
NOT_RETRIED_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchKey",
                     "InvalidBucketName", "ExpiredToken", "InvalidToken", "PermanentRedirect", "AllAccessDisabled"}


def is_remote(path: Optional[str]) -> bool:
    """Whether ``data.path`` names a bucket rather than a path of the file system."""
    return bool(path) and str(path).startswith(SCHEME)


@dataclass(frozen=True)
class Location:
    """``s3://BUCKET/PREFIX``: a dataset's folder in a bucket (``prefix`` without its slashes at either end)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "Location":
        """The location of ``url``; ValueError in one line when it is not ``s3://BUCKET[/PREFIX]``."""
        bucket, _, prefix = url[len(SCHEME):].partition("/") if is_remote(url) else ("", "", "")
        if not bucket or any(c in bucket for c in " \\?#"):
            raise ValueError(f"{url!r} is not an object store path: use s3://BUCKET/PREFIX")
        return cls(bucket, prefix.strip("/"))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str = "") -> str:
        return f"{SCHEME}{self.bucket}/{self.key(name)}" if name else f"{SCHEME}{self.bucket}/{self.prefix}"


class StoreError(OSError):
    """The store did not serve a request, in one line naming the object and the endpoint. ``retried``: after the
    whole retry budget (the store's fault, which a later try may not meet) or not retried at all (a refused
    credential, a missing bucket or object: the same on every try, so a task's error is the code's or the
    data's, per ``fault``)."""

    def __init__(self, message: str, fault: Fault = Fault.STORE, missing: str = "") -> None:
        super().__init__(message)
        self.fault, self.missing = fault, missing  # missing: "key" or "bucket" when that is what is not there

    @property
    def short(self) -> str:
        """What ``launcher runs`` shows beside FAILED."""
        return {Fault.DATA: "bad data", Fault.STORE: "store unreachable"}.get(self.fault, "store refused")


@dataclass(frozen=True)
class Credentials:
    """A key pair (and session token) resolved at launch, for tasks that have no other (:data:`CREDENTIALS_FILE`)."""

    access_key: str
    secret_key: str
    token: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps({"access_key": self.access_key, "secret_key": self.secret_key, "token": self.token})

    @classmethod
    def from_json(cls, text: str) -> "Credentials":
        data = json.loads(text)
        return cls(data["access_key"], data["secret_key"], data.get("token"))


def _botocore():
    try:
        import boto3  # noqa: F401  lazy, as every import of boto3 here: only a run on a bucket loads it
        import botocore.config  # lazy
        import botocore.exceptions  # lazy
    except ImportError:
        raise StoreError("data.path is an s3:// path, but this Python has no boto3: "
                         "pip install 'slurm-gpt-launcher[s3]' (or boto3)", Fault.CODE) from None
    return botocore


@dataclass
class Store:
    """A client of one store, as ``settings`` (endpoint, region, addressing style, retry budget) say; credentials
    from ``credentials``, else :data:`CREDENTIALS_FILE`, else botocore's chain (the environment, a profile)."""

    settings: StoreConfig
    credentials: Optional[Credentials] = None
    connections: int = 8
    _client: Any = None

    @property
    def endpoint(self) -> str:
        return self.client.meta.endpoint_url

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        botocore = _botocore()
        import boto3  # lazy

        cfg = self.settings
        style = cfg.addressing_style or "auto"
        config = botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # one retry loop: ours (retrying)
            connect_timeout=min(10.0, cfg.stall_s), read_timeout=cfg.stall_s, max_pool_connections=self.connections,
            s3={"addressing_style": style}, user_agent_extra=f"slurm-gpt-launcher node/{_node()}",
            request_checksum_calculation="when_required", response_checksum_validation="when_required")
        creds = self.credentials or _launch_credentials()
        session = boto3.session.Session()
        keys = {"aws_access_key_id": creds.access_key, "aws_secret_access_key": creds.secret_key,
                "aws_session_token": creds.token} if creds else {}
        return session.client("s3", endpoint_url=cfg.endpoint_url or None, region_name=cfg.region or None,
                              config=config, **keys)

    # ------------------------------------------------------------------------------------------
    # The retry loop

    def retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, tried again as the module's docstring says; StoreError naming ``what`` when it cannot."""
        botocore = _botocore()
        deadline, tries = time.monotonic() + self.settings.retry_s, 0
        while True:
            try:
                return call()
            except botocore.exceptions.ClientError as err:
                last = self._client_error(err, what)
            except (botocore.exceptions.BotoCoreError, OSError, _Stalled) as err:
                if isinstance(err, StoreError):
                    raise
                if isinstance(err, botocore.exceptions.NoCredentialsError):
                    raise StoreError(f"no credentials for {self.endpoint}: {CREDENTIALS_HINT}", Fault.CODE) from None
                last = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            tries += 1
            wait = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** tries))
            if time.monotonic() + wait > deadline:
                raise StoreError(f"the store at {self.endpoint} did not serve {what} in {self.settings.retry_s:g} s "
                                 f"({tries} tries; the last: {last}); data.store.retry_s sets how long to try")
            time.sleep(wait)

    def _client_error(self, err: Any, what: str) -> str:
        """The retried error's text, or StoreError (not retried) for an answer that another try would repeat."""
        info = err.response.get("Error", {})
        code, status = str(info.get("Code", "")), err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status in RETRIED_STATUS and code not in NOT_RETRIED_CODES:
            return f"{status} {code}".strip()
        if code in ("NoSuchKey", "404", "NotFound") or status == 404 and code != "NoSuchBucket":
            raise StoreError(f"{what} does not exist at {self.endpoint}", Fault.DATA, missing="key") from None
        if code == "NoSuchBucket":
            raise StoreError(f"{what}: its bucket does not exist at {self.endpoint}", Fault.DATA, missing="bucket") \
                from None
        if status == 412:
            raise StoreError(f"{what} changed while it was read (its ETag is not the one first served)",
                             Fault.DATA) from None
        reason = f"{status} {code}: {info.get('Message') or ''}".strip().rstrip(":")
        if status in (401, 403):
            raise StoreError(f"{what} at {self.endpoint} was refused ({reason}): {CREDENTIALS_HINT}",
                             Fault.CODE) from None
        raise StoreError(f"{what} at {self.endpoint} failed ({reason})", Fault.CODE) from None

    # ------------------------------------------------------------------------------------------
    # Reading

    def head(self, location: Location, name: str) -> Tuple[int, str]:
        """An object's size and ETag."""
        key = location.key(name)
        answer = self.retrying(location.url(name), lambda: self.client.head_object(Bucket=location.bucket, Key=key))
        return int(answer["ContentLength"]), answer["ETag"]

    def read(self, location: Location, name: str) -> bytes:
        """An object whole (a dataset's metadata, its tokenizer)."""
        key = location.key(name)

        def get() -> bytes:
            body = self.client.get_object(Bucket=location.bucket, Key=key)["Body"]
            return b"".join(_chunks(body, self.settings.stall_s))
        return self.retrying(location.url(name), get)

    def rate(self, location: Location, name: str, size: int) -> float:
        """Bytes a second this host reads the object ``name`` at: its first MiB (at most ``size``), timed."""
        key, length = location.key(name), max(1, min(size, 1 << 20))

        def get() -> float:
            began = time.perf_counter()
            body = self.client.get_object(Bucket=location.bucket, Key=key, Range=f"bytes=0-{length - 1}")["Body"]
            got = sum(map(len, _chunks(body, self.settings.stall_s)))
            return got / max(time.perf_counter() - began, 1e-6)
        return self.retrying(location.url(name), get)

    def listing(self, location: Location) -> Dict[str, Tuple[int, str]]:
        """Every object under the location's prefix by its name there: (size, ETag). One request per 1,000."""
        prefix = location.key("")
        found: Dict[str, Tuple[int, str]] = {}
        token: Optional[str] = None
        while True:
            more = {"ContinuationToken": token} if token else {}
            page = self.retrying(location.url(), lambda: self.client.list_objects_v2(
                Bucket=location.bucket, Prefix=prefix, **more))
            for item in page.get("Contents", []):
                found[item["Key"][len(prefix):]] = (int(item["Size"]), item.get("ETag", ""))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def download(self, location: Location, name: str, size: int, write: Callable[[bytes], None]) -> int:
        """The object ``name`` of ``size`` bytes, handed to ``write`` in order, each byte once, resuming where a
        failed try got to (a Range request held to the ETag first served); returns the bytes written. A size
        other than ``size`` is StoreError of the data's fault, before anything is written."""
        key, url = location.key(name), location.url(name)
        got, etag = 0, None

        def get() -> int:
            nonlocal got, etag
            held = {"IfMatch": etag} if etag else {}
            ranged = {"Range": f"bytes={got}-"} if got else {}
            answer = self.client.get_object(Bucket=location.bucket, Key=key, **held, **ranged)
            total = got + int(answer["ContentLength"])
            if total != size:
                raise StoreError(f"{url} has {total:,} bytes, not the {size:,} the dataset's metadata records: "
                                 "it was replaced or damaged; prepare or upload the dataset again", Fault.DATA)
            etag = etag or answer.get("ETag")
            for chunk in _chunks(answer["Body"], self.settings.stall_s):
                write(chunk)
                got += len(chunk)
            if got != size:
                raise _Stalled(f"the body ended after {got:,} of {size:,} bytes")
            return got
        return self.retrying(url, get)

    # ------------------------------------------------------------------------------------------
    # Writing (launcher data prepare)

    def upload(self, location: Location, name: str, path: str) -> str:
        """The file ``path`` as the object ``name`` (multipart above 64 MiB, read from the file a part at a time:
        memory stays bounded); returns the ETag the store gave it."""
        import boto3.s3.transfer  # lazy

        key = location.key(name)
        transfer = boto3.s3.transfer.TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20,
                                                    max_concurrency=4, use_threads=True)
        self.retrying(location.url(name), lambda: self.client.upload_file(path, location.bucket, key,
                                                                          Config=transfer))
        return self.head(location, name)[1]

    def put(self, location: Location, name: str, data: bytes) -> str:
        """``data`` as the object ``name``; its ETag."""
        key = location.key(name)
        answer = self.retrying(location.url(name), lambda: self.client.put_object(
            Bucket=location.bucket, Key=key, Body=data))
        return answer["ETag"]

    def delete(self, location: Location, name: str) -> None:
        key = location.key(name)
        self.retrying(location.url(name), lambda: self.client.delete_object(Bucket=location.bucket, Key=key))


CREDENTIALS_HINT = ("give the store's key with 'launcher secrets create env AWS_ACCESS_KEY_ID ...' and "
                    "'... AWS_SECRET_ACCESS_KEY ...', or launch from a shell where 'aws s3 ls' works")


class _Stalled(Exception):
    """A transfer cut: its body ended early, or delivered less than STALL_BYTES in stall_s seconds."""


def _chunks(body: Any, stall_s: float) -> Iterator[bytes]:
    """A response body in chunks of at most CHUNK bytes; _Stalled when a window of ``stall_s`` seconds brought less
    than STALL_BYTES (a trickle that never times out a socket read is cut as a stall is)."""
    try:
        window_start, window_bytes = time.monotonic(), 0
        while True:
            chunk = body.read(CHUNK)
            if not chunk:
                return
            yield chunk
            window_bytes += len(chunk)
            now = time.monotonic()
            if now - window_start >= stall_s:
                if window_bytes < STALL_BYTES:
                    raise _Stalled(f"{window_bytes:,} bytes in {now - window_start:.0f} s")
                window_start, window_bytes = now, 0
    finally:
        body.close()


def _node() -> str:
    """The node this process runs on, as Slurm names it (its requests name it: a store's logs show each node's)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _launch_credentials() -> Optional[Credentials]:
    """The credentials the launch captured for this run's tasks (:data:`CREDENTIALS_FILE`), if any."""
    path = os.environ.get(CREDENTIALS_FILE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return Credentials.from_json(handle.read())
    except (OSError, ValueError, KeyError) as err:
        raise StoreError(f"the run's store credentials {path} cannot be read ({type(err).__name__}); "
                         f"{CREDENTIALS_HINT}", Fault.CODE) from None


def resolve(settings: StoreConfig) -> StoreConfig:
    """``settings`` with what botocore resolves on this host filled in (the endpoint from ``AWS_ENDPOINT_URL`` or
    the profile's ``endpoint_url``, the region, the profile's addressing style), so that the tasks reach the same
    store whatever their environment; a value set in the run or the cluster file wins."""
    botocore = _botocore()
    import boto3  # lazy
    import botocore.session  # lazy

    core = botocore.session.Session()
    try:
        client = boto3.session.Session(botocore_session=core).client(
            "s3", endpoint_url=settings.endpoint_url or None, region_name=settings.region or None)
        s3 = (core.get_scoped_config() or {}).get("s3") or {}
    except botocore.exceptions.BotoCoreError as err:  # a profile that is not there, an endpoint that is no URL
        raise StoreError(f"the object store cannot be set up: {err}", Fault.CODE) from None
    style = settings.addressing_style or (s3.get("addressing_style") if isinstance(s3, dict) else None)
    return dataclasses.replace(settings, endpoint_url=client.meta.endpoint_url, region=client.meta.region_name,
                       addressing_style=style or "auto")


def login_credentials() -> Optional[Credentials]:
    """The credentials botocore finds in this process (environment, profile, SSO cache), frozen; None if none."""
    _botocore()
    import boto3  # lazy

    found = boto3.session.Session().get_credentials()
    if found is None:
        return None
    frozen = found.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)
