"""The suite's S3 store (tests/support/s3.py): moto's server behind the fault proxy does, with a real boto3 client,
what the tests of training data read from S3 rely on: objects go in and come out whole, multipart uploads
included, and each fault the proxy is asked for reaches the client as a real store's would."""
from __future__ import annotations

import hashlib
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

MIB = 1024 * 1024
NO_RETRY = {"mode": "standard", "total_max_attempts": 1}
# A request of our own, not boto3's, still names S3 in an Authorization header: moto's server sends a request to its
# S3 by the header's credential scope (it checks no signature).
S3_SCOPE = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"


def put(store, key: str, size: int) -> bytes:
    data = os.urandom(size)
    store.client().put_object(Bucket=store.bucket, Key=key, Body=data)
    return data


def read(client, bucket: str, key: str) -> bytes | BotoCoreError:
    """The object's body as the client reads it, or the error that stopped it."""
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except BotoCoreError as error:
        return error


def raw_get(endpoint: str, path: str) -> tuple[bytes, OSError | None]:
    """What a client reads from a plain socket (headers and body) until the connection ends, and how it ended:
    None for a clean close."""
    received = b""
    address = urlsplit(endpoint)
    with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
        request = f"GET {path} HTTP/1.1\r\nHost: {address.netloc}\r\nAuthorization: {S3_SCOPE}\r\n\r\n"
        connection.sendall(request.encode())
        try:
            while piece := connection.recv(65536):
                received += piece
        except OSError as error:
            return received, error
    return received, None


def test_objects_go_in_and_come_out_whole(s3_store, tmp_path):
    client = s3_store.client()
    client.put_object(Bucket=s3_store.bucket, Key="small", Body=b"hello")
    assert read(client, s3_store.bucket, "small") == b"hello"
    big = tmp_path / "big"
    big.write_bytes(os.urandom(11 * MIB))  # three parts of moto's minimum 5 MiB: 5, 5 and 1
    client.upload_file(str(big), s3_store.bucket, "big", Config=TransferConfig(multipart_threshold=5 * MIB,
                                                                               multipart_chunksize=5 * MIB))
    head = client.head_object(Bucket=s3_store.bucket, Key="big")
    assert head["ContentLength"] == 11 * MIB and head["ETag"].endswith('-3"')  # S3's ETag of a 3-part upload
    assert hashlib.sha256(read(client, s3_store.bucket, "big")).digest() == hashlib.sha256(big.read_bytes()).digest()
    upload = [r for r in s3_store.proxy.requests() if r.path == f"/{s3_store.bucket}/big"][:5]
    assert [(r.method, sorted(parse_qs(r.query, keep_blank_values=True)), r.status) for r in upload] == [
        ("POST", ["uploads"], 200), *[("PUT", ["partNumber", "uploadId"], 200)] * 3, ("POST", ["uploadId"], 200)]
    assert {parse_qs(r.query)["partNumber"][0] for r in upload[1:4]} == {"1", "2", "3"}  # sent side by side
    assert s3_store.proxy.requests()[-1].sent == 11 * MIB


def test_a_chunked_upload_and_keep_alive(s3_store):
    """A body sent chunked (no length) is forwarded as sent, and the client's connection serves the next request."""
    connection = http.client.HTTPConnection(urlsplit(s3_store.endpoint).netloc, timeout=10)
    connection.request("PUT", f"/{s3_store.bucket}/chunked", body=iter([b"abc", b"defg"]),
                       headers={"Authorization": S3_SCOPE})
    assert connection.getresponse().read() == b""
    connection.request("GET", f"/{s3_store.bucket}/chunked", headers={"Authorization": S3_SCOPE})
    answer = connection.getresponse()
    assert (answer.status, answer.read()) == (200, b"abcdefg")
    connection.close()
    assert [r.method for r in s3_store.proxy.requests()] == ["PUT", "GET"]


def test_a_503_burst_is_absorbed_by_retries(s3_store):
    put(s3_store, "shard", 1000)
    s3_store.proxy.fail(1, match="/other")  # another object's: never met here
    s3_store.proxy.fail(2)
    assert len(read(s3_store.client(), s3_store.bucket, "shard")) == 1000
    assert [(r.status, r.fault) for r in s3_store.proxy.requests()[1:]] == [(503, "fail"), (503, "fail"), (200, None)]
    s3_store.proxy.fail(1)
    with pytest.raises(ClientError) as raised:  # without retries, the client sees S3's own answer
        s3_store.client(retries=NO_RETRY).get_object(Bucket=s3_store.bucket, Key="shard")
    assert raised.value.response["Error"]["Code"] == "SlowDown"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503


@pytest.mark.parametrize("fault", ["reset", "truncate"])
def test_a_transfer_cut_short_is_an_error(s3_store, fault):
    data = put(s3_store, "shard", MIB)
    getattr(s3_store.proxy, fault)(1)
    got = read(s3_store.client(retries=NO_RETRY), s3_store.bucket, "shard")
    assert isinstance(got, BotoCoreError) or len(got) < MIB, f"{fault}: the whole object arrived"
    assert (s3_store.proxy.requests()[-1].fault, s3_store.proxy.requests()[-1].sent) == (fault, MIB // 2)
    assert read(s3_store.client(retries=NO_RETRY), s3_store.bucket, "shard") == data  # only the next one

    getattr(s3_store.proxy, fault)(1)
    received, ended = raw_get(s3_store.endpoint, f"/{s3_store.bucket}/shard")
    head, _, body = received.partition(b"\r\n\r\n")
    assert f"Content-Length: {MIB}".encode() in head and len(body) <= MIB // 2
    if fault == "reset":
        assert isinstance(ended, ConnectionResetError)
    else:
        assert ended is None and len(body) == MIB // 2


def test_a_trickle_is_slow_and_a_stall_holds_up_no_one(s3_store):
    put(s3_store, "slow", 64 * 1024)
    s3_store.proxy.trickle(1, 128 * 1024)
    start = time.monotonic()
    assert len(read(s3_store.client(), s3_store.bucket, "slow")) == 64 * 1024
    assert 64 * 1024 / (time.monotonic() - start) <= 128 * 1024

    s3_store.proxy.trickle(1, 1)  # a byte a second: stalled
    impatient = s3_store.client(retries=NO_RETRY, read_timeout=0.3)
    assert isinstance(read(impatient, s3_store.bucket, "slow"), BotoCoreError)  # it gave up and closed
    assert len(read(s3_store.client(), s3_store.bucket, "slow")) == 64 * 1024
    assert [r.fault for r in s3_store.proxy.requests()[-3:]] == ["trickle", "trickle", None]


def test_bandwidth_is_capped_across_connections(s3_store):
    for key in ("a", "b"):
        put(s3_store, key, 64 * 1024)
    client = s3_store.client()
    s3_store.proxy.bandwidth(256 * 1024)
    got = {}
    start = time.monotonic()
    readers = [threading.Thread(target=lambda key=key: got.update({key: read(client, s3_store.bucket, key)}))
               for key in ("a", "b")]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert 2 * 64 * 1024 / (time.monotonic() - start) <= 256 * 1024
    assert [len(body) for body in got.values()] == [64 * 1024, 64 * 1024]
    s3_store.proxy.bandwidth(None)
    assert len(read(client, s3_store.bucket, "a")) == 64 * 1024


def test_requests_are_recorded_as_sent(s3_store):
    put(s3_store, "shard", 100)
    s3_store.proxy.clear()
    client = s3_store.client(user_agent_extra="node/node1")
    assert len(client.get_object(Bucket=s3_store.bucket, Key="shard", Range="bytes=10-19")["Body"].read()) == 10
    client.list_objects_v2(Bucket=s3_store.bucket, Prefix="sh")
    (ranged, listed) = s3_store.proxy.requests()
    assert (ranged.method, ranged.path, ranged.range, ranged.status, ranged.sent) == (
        "GET", f"/{s3_store.bucket}/shard", "bytes=10-19", 206, 10)
    assert ranged.user_agent.startswith("Boto3/") and ranged.user_agent.endswith("node/node1")
    assert (listed.path, "list-type=2" in listed.query, "prefix=sh" in listed.query) == (
        f"/{s3_store.bucket}", True, True)


def test_a_client_process_needs_only_the_environment(s3_store):
    """A process started with the store's environment (the test's own holds it too) reaches the store through the
    proxy with boto3's defaults, as a task would."""
    assert {name: os.environ[name] for name in s3_store.env} == s3_store.env
    assert not os.path.exists(s3_store.env["AWS_CONFIG_FILE"])
    put(s3_store, "shard", 10)
    s3_store.proxy.clear()
    code = (f"import boto3; body = boto3.client('s3').get_object(Bucket={s3_store.bucket!r}, Key='shard')['Body']; "
            "print(len(body.read()))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **s3_store.env}, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "10\n"), done.stderr
    assert [(r.method, r.path) for r in s3_store.proxy.requests()] == [("GET", f"/{s3_store.bucket}/shard")]
