"""URLs parsed once, configuration read as the providers' tools read it, secrets never shown."""

from __future__ import annotations

import json
import sys

import pytest

from pskd_jax.errors import StorageError, UsageError
from pskd_jax.storage import StorageOptions, is_object_url, is_url, locate, redact, resolve
from pskd_jax.storage.config import aws_profile_config, gcs_settings, s3_settings


@pytest.mark.parametrize(("text", "scheme", "bucket", "key"), [
    ("s3://bkt/a/b.psk.d", "s3", "bkt", "a/b.psk.d"),
    ("S3://bkt/a/", "s3", "bkt", "a"),
    ("gs://my.bucket-1/x", "gs", "my.bucket-1", "x"),
    ("gs://bkt", "gs", "bkt", ""),
    ("memory://anything/k", "memory", "anything", "k"),
    ("file:///tmp/a%20b", "file", "", "/tmp/a b"),
    ("file://localhost/tmp/x", "file", "", "/tmp/x"),
    ("relative/path.psk.d", "file", "", "relative/path.psk.d"),
    ("./s3:not-a-url", "file", "", "./s3:not-a-url"),  # a local name holding a colon: written ./name
    ("dir/a:b", "file", "", "dir/a:b"),
])
def test_locations(text, scheme, bucket, key):
    where = locate(text)
    assert (where.scheme, where.bucket, where.key) == (scheme, bucket, key)


@pytest.mark.parametrize(("text", "words"), [
    ("ftp://host/x", "cannot serve ftp://"),
    ("hdfs://nn/x", "cannot serve hdfs://"),
    ("s3://Bad_Bucket/x", "not a bucket name"),
    ("s3://ab/x", "not a bucket name"),
    ("s3://bkt/a//b", "empty, '.' or '..' part"),
    ("gs://bkt/a/../b", "empty, '.' or '..' part"),
    ("file://otherhost/x", "not of host"),
    ("memory:///k", "names a store first"),
    ("s3:/bkt/x", "starts like a URL (s3:) but not with s3://"),
    ("s3:bkt/x", "starts like a URL (s3:) but not with s3://"),
    ("gs:relative", "starts like a URL (gs:) but not with gs://"),
    ("S3:/bkt/x", "starts like a URL (S3:) but not with S3://"),
    ("hdfs:x", "starts like a URL (hdfs:) but not with hdfs://"),
    ("file:/tmp/x", "starts like a URL (file:) but not with file://"),
    ("s3://bkt/a\x7fb", "control character"),  # (DEL, which the client refuses as a retried-sounding failure)
    ("s3://bkt/a\udcffb", "not UTF-8"),  # (a command line's byte 0xff: no key can hold it)
])
def test_refused_urls_name_themselves(text, words):
    with pytest.raises(StorageError, match="E9018") as refused:
        locate(text)
    assert words in str(refused.value) and text in str(refused.value)


def test_a_url_without_its_slashes_is_a_url_never_a_path():
    assert is_url("s3:/x") and is_url("gs:relative") and is_url("hdfs://x/y")
    assert not is_url("./gs:relative") and not is_url("runs/a:b") and not is_url("/abs/s3:x")


def test_object_url_test():
    assert is_object_url("gs://b/k") and is_object_url("memory://m/k")
    assert not is_object_url("file:///x") and not is_object_url("x/y") and not is_object_url("ftp://h/x")


def test_profile_files(tmp_path):
    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n"
                           "[work]\naws_access_key_id = C\naws_secret_access_key = D\naws_session_token = E\n")
    settings = tmp_path / "config"
    settings.write_text("[profile work]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9000\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": str(credentials), "AWS_CONFIG_FILE": str(settings)}
    assert aws_profile_config(files) == {"access_key_id": "A", "secret_access_key": "B"}
    assert aws_profile_config({**files, "AWS_PROFILE": "work"}) == {
        "access_key_id": "C", "secret_access_key": "D", "session_token": "E", "region": "eu-west-3",
        "endpoint": "http://127.0.0.1:9000"}
    # keys in the environment win, and the files are not read
    assert aws_profile_config({**files, "AWS_ACCESS_KEY_ID": "X"}) == {}


def test_explicit_options_win_and_allow_http():
    config, client = s3_settings(StorageOptions(config={"region": "ap-south-1"}, allow_http=True),
                                 {"AWS_ACCESS_KEY_ID": "k"})
    assert config == {"region": "ap-south-1"} and client == {"allow_http": True}
    assert s3_settings(StorageOptions(), {"AWS_ACCESS_KEY_ID": "k", "AWS_ALLOW_HTTP": "true"})[1] == \
        {"allow_http": True}
    config, client = gcs_settings(StorageOptions(), {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert config["base_url"] == "http://127.0.0.1:4443" and config["skip_signature"] and client["allow_http"]
    assert json.loads(config["service_account_key"])["disable_oauth"] is True  # writes ask no metadata server


@pytest.mark.parametrize("bad", [{"retries": -1}, {"concurrency": 0}, {"part_bytes": 10}, {"retry_seconds": 0},
                                 {"allow_http": "yes"}, {"config": ["endpoint"]}, {"backoff_seconds": 0},
                                 {"backoff_seconds": 6}, {"backoff_seconds": True}, {"retry_seconds": "1"}])
def test_options_are_checked_naming_the_parameter(bad):
    with pytest.raises(UsageError, match=next(iter(bad))):
        StorageOptions(**bad)


def test_secrets_never_shown(monkeypatch):
    options = StorageOptions(config={"access_key_id": "AKIAEXAMPLE", "secret_access_key": "very-secret-words"})
    assert "very-secret-words" not in repr(options) and "AKIAEXAMPLE" not in repr(options)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    assert redact("key very-secret-words and environment-secret", options) == "key *** and ***"


def test_error_messages_hold_no_credentials(s3_bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")  # the server refuses nothing, so:
    store, where = resolve(f"s3://{s3_bucket.name}-missing/x")  # a bucket that does not exist
    with pytest.raises(StorageError) as failed:
        store.put(where.key, b"x")
    assert "wrong-secret-value" not in str(failed.value) and "pskdtestkey" not in str(failed.value)
    assert where.url in str(failed.value)


def test_without_the_client_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)  # as if not installed
    with pytest.raises(StorageError, match=r"pip install 'pskd_jax\[storage\]'"):
        resolve("s3://some-bucket/k", StorageOptions(retries=0))


@pytest.mark.parametrize("text", ["s3://AKIAURLKEYID:url-secret-words@bkt/k", "s3://bkt/url-secret-words/../k",
                                  "gs://url-secret-words@bkt/x", "memory:///url-secret-words"])
def test_a_refused_url_shows_no_credential(monkeypatch, text):
    # (found by fuzz/targets.py's url target: locate's E9018 quoted the URL and its bucket as typed)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "url-secret-words")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAURLKEYID")
    with pytest.raises(StorageError, match="E9018") as refused:
        locate(text)
    shown = str(refused.value)
    assert "url-secret-words" not in shown and "AKIAURLKEYID" not in shown and "***" in shown
