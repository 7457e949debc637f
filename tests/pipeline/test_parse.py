"""Pipeline text (pskd_jax.pipeline.parse): what parses and to what, the canonical text back, errors
that name line and column, pipeline files and the directory they may stream from."""

from __future__ import annotations

import os

import pytest

from pskd_jax.errors import PskdError
from pskd_jax.pipeline.batches import Pipeline
from pskd_jax.pipeline.parse import load_pipeline, parse_pipeline

FULL = 'stream "train.psk.d" |> shuffle(seed = 42) |> batch(B = 4) |> take(n = 3)'


def test_parse_the_full_pipeline():
    pipeline = parse_pipeline(FULL, base_dir="/data")
    assert pipeline == Pipeline(path="/data/train.psk.d", seed=42, batch_size=4, take=3)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('stream "a" |> batch(B = 1)', Pipeline("base/a", None, 1, None)),
        ('stream "a"|>shuffle(seed=0)|>batch(B=7)', Pipeline("base/a", 0, 7, None)),
        ('stream "a" |> batch(B = 2) |> take(n = 9)', Pipeline("base/a", None, 2, 9)),
        ('\n  stream "dir/a b.psk.d"\n  |> shuffle(seed = 18446744073709551615)\n  |> batch(B = 32)\n',
         Pipeline("base/dir/a b.psk.d", 2**64 - 1, 32, None)),
        ('stream "/abs/a" |> batch(B = 3)', Pipeline("/abs/a", None, 3, None)),
    ],
)
def test_parse_whitespace_is_free_and_stages_optional(text, expected):
    assert parse_pipeline(text, base_dir="base") == expected


def test_str_writes_the_canonical_text_back():
    pipeline = parse_pipeline(FULL, base_dir="/data")
    assert str(pipeline) == 'stream "/data/train.psk.d" |> shuffle(seed = 42) |> batch(B = 4) |> take(n = 3)'
    assert parse_pipeline(str(pipeline)) == pipeline


@pytest.mark.parametrize(
    "text, message",
    [
        ('stream "d" |> shuffle(seed = 42x) |> batch(B = 1)', "pipeline:1:32: expected ')' after seed = 42, found 'x'"),
        ('strem "d" |> batch(B = 1)', "pipeline:1:1: expected 'stream' at the start of the pipeline, found 'strem'"),
        ("stream d |> batch(B = 1)", "pipeline:1:8: expected a quoted path (\"…\") after stream, found 'd'"),
        ('stream "d |> batch(B = 1)', "pipeline:1:8: unterminated path"),
        ('stream "" |> batch(B = 1)', "pipeline:1:8: expected a non-empty path"),
        ('stream "d"', "pipeline:1:11: expected '|> batch(B = n)' after stream \"d\""),
        ('stream "d" |> shuffle(seed = 1)', "pipeline:1:32: expected '|> batch(B = n)' after shuffle(seed = 1)"),
        ('stream "d" batch(B = 1)',
         "pipeline:1:12: expected '|>' or the end of the pipeline after stream \"d\", found 'batch'"),
        ('stream "d" |> batch(B = 0)', "pipeline:1:25: B must be an integer >= 1, got B = 0"),
        ('stream "d" |> batch(B = -1)', "pipeline:1:25: expected an integer >= 1 after B =, found '-'"),
        ('stream "d" |> batch(B = 2) |> take(n = 0)', "pipeline:1:40: n must be an integer >= 1, got n = 0"),
        (
            'stream "d" |> shuffle(seed = 18446744073709551616) |> batch(B = 1)',
            "pipeline:1:30: seed must be an integer in [0, 2**64), got seed = 18446744073709551616",
        ),
        ('stream "d" |> batch(n = 3)', "pipeline:1:21: expected 'B' after batch(, found 'n'"),
        ('stream "d" |> batch B = 3', "pipeline:1:21: expected '(' after batch, found 'B'"),
        ('stream "d" |> batch(B 3)', "pipeline:1:23: expected '=' after batch(B, found '3'"),
        ('stream "d" |> repeat(n = 2) |> batch(B = 1)',
         "pipeline:1:15: expected a stage (shuffle, batch or take) after '|>', found 'repeat'"),
        ('stream "d" |> batch(B = 1) |>',
         "pipeline:1:30: expected a stage (shuffle, batch or take) after '|>', found the end of the text"),
        ('stream "d" |> batch(B = 1) |> batch(B = 2)', "pipeline:1:31: duplicate stage 'batch' (first at 1:15)"),
        ('stream "d" |> batch(B = 1) |> shuffle(seed = 2)', "pipeline:1:31: stage 'shuffle' must come before 'batch'"),
        ('stream "d" |> take(n = 1) |> batch(B = 2)', "pipeline:1:30: stage 'batch' must come before 'take'"),
        ('stream "d" |> batch(B = 1) ;',
         "pipeline:1:28: expected '|>' or the end of the pipeline after batch(B = 1), found ';'"),
        ('stream "d"\n |> batch(B = 1)\n |> take(n = x)',
         "pipeline:3:14: expected an integer >= 1 after n =, found 'x'"),
        # Every line end a text may have counts a line: CRLF, and a lone CR (as old Macs write them).
        ('stream "d"\r\n |> batch(B = 1)\r\n |> take(n = x)',
         "pipeline:3:14: expected an integer >= 1 after n =, found 'x'"),
        ('stream "d"\r |> batch(B = 1)\r |> take(n = x)',
         "pipeline:3:14: expected an integer >= 1 after n =, found 'x'"),
        ('stream "d"\r\r\n\n|> batch(B = 0)', "pipeline:4:14: B must be an integer >= 1"),
        # A path ends at its line's end, whichever: never a path holding a CR.
        ('stream "d\r" |> batch(B = 1)', "pipeline:1:8: unterminated path \"d: expected a closing"),
        ('stream "d\r\n|> batch(B = 1)', "pipeline:1:8: unterminated path \"d: expected a closing"),
    ],
)
def test_parse_errors_name_line_column_and_what_was_expected(text, message):
    with pytest.raises(PskdError) as raised:
        parse_pipeline(text)
    assert raised.value.code == "E9010"
    assert message in raised.value.message, raised.value.message


def test_leading_zeros_do_not_count_towards_an_integer_s_digits():
    # int() refuses a string of over 4300 digits, leading zeros included: the value is read without them
    zeros = "0" * 5000
    assert parse_pipeline(f'stream "d" |> shuffle(seed = {zeros}7) |> batch(B = {zeros}2)') == parse_pipeline(
        'stream "d" |> shuffle(seed = 7) |> batch(B = 2)')
    with pytest.raises(PskdError) as raised:
        parse_pipeline(f'stream "d" |> batch(B = {zeros})')
    assert raised.value.code == "E9010"
    assert "pipeline:1:25: B must be an integer >= 1, got B = 0" in raised.value.message


def test_a_pipeline_file_may_start_with_a_byte_order_mark(tmp_path):
    """Some editors write UTF-8 with a byte-order mark first: no part of the text, so an error
    after it still names the line and column a reader counts."""
    (tmp_path / "a.pipeline").write_bytes(b'\xef\xbb\xbfstream "d.psk.d" |> batch(B = 2)\n')
    assert load_pipeline(tmp_path / "a.pipeline").batch_size == 2
    (tmp_path / "b.pipeline").write_bytes(b'\xef\xbb\xbfstream "d.psk.d" |> batch(B = x)\n')
    with pytest.raises(PskdError, match=r"b\.pipeline:1:31: .*found .x."):
        load_pipeline(tmp_path / "b.pipeline")


def test_parse_refuses_what_is_not_text():
    with pytest.raises(PskdError) as raised:
        parse_pipeline(b'stream "d" |> batch(B = 1)')  # type: ignore[arg-type]
    assert raised.value.code == "E9010"


def test_load_resolves_the_path_against_the_file_directory(tmp_path, monkeypatch):
    (tmp_path / "runs" / "data").mkdir(parents=True)
    text_file = tmp_path / "runs" / "train.pipeline"
    text_file.write_text('stream "data/train.psk.d" |> shuffle(seed = 3) |> batch(B = 8)\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # a relative file path; the result must not depend on the cwd later
    pipeline = load_pipeline(os.path.join("runs", "train.pipeline"))
    assert pipeline.path == os.path.join(str(tmp_path), "runs", "data/train.psk.d")
    assert (pipeline.seed, pipeline.batch_size, pipeline.take) == (3, 8, None)


def test_a_pipeline_file_streams_only_inside_its_directory_or_root(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.psk.d").write_bytes(b"")
    os.symlink(tmp_path / "data", tmp_path / "runs" / "link-out")
    os.symlink("inside.psk.d", tmp_path / "runs" / "link-in.psk.d")
    text_file = tmp_path / "runs" / "train.pipeline"

    def load(path_text, **options):
        text_file.write_text(f'stream "{path_text}" |> batch(B = 8)\n', encoding="utf-8")
        return load_pipeline(text_file, **options)

    for outside in ["../data/train.psk.d", str(tmp_path / "data" / "train.psk.d"), "/etc/passwd",
                    "link-out/train.psk.d", "sub/../../data/train.psk.d", ".", "./"]:
        with pytest.raises(PskdError) as raised:
            load(outside)
        assert raised.value.code == "E9010", outside
        assert str(text_file) in raised.value.message and "outside" in raised.value.message
    assert load("link-in.psk.d").path == str(tmp_path / "runs" / "link-in.psk.d")  # a symlink that stays in
    assert load("sub/../x.psk.d").path.endswith("sub/../x.psk.d")
    assert os.path.normpath(load("../data/train.psk.d", root=tmp_path).path) == str(tmp_path / "data" / "train.psk.d")
    assert load("link-out/train.psk.d", root=tmp_path).path.endswith("link-out/train.psk.d")
    with pytest.raises(PskdError):
        load("/etc/passwd", root=tmp_path)
    # Text the caller gives directly is the caller's own argument: any path.
    assert parse_pipeline('stream "/etc/passwd" |> batch(B = 1)').path == "/etc/passwd"


@pytest.mark.parametrize("cwd", ["the file's directory", "elsewhere"])
def test_a_pipeline_file_streaming_a_url_takes_it_as_a_url_from_any_directory(tmp_path, monkeypatch, cwd):
    """A URL is no path of the local tree the directory rule keeps a pipeline file inside: it is
    taken as it is, from any directory. It was resolved as a relative path from the current
    directory: accepted when run from the file's directory, and refused elsewhere as 'leads to
    CWD/s3:/bucket/…'."""
    (tmp_path / "runs").mkdir()
    text_file = tmp_path / "runs" / "train.pipeline"
    text_file.write_text('mix(stream "a.psk.d" : 1, stream "s3://bucket/web/shards.json" : 1) |> batch(B = 8)\n',
                         encoding="utf-8")
    monkeypatch.chdir(tmp_path / "runs" if cwd == "the file's directory" else tmp_path)
    for root in (None, tmp_path):
        mixture = load_pipeline(text_file, root=root)
        assert mixture.paths == (str(tmp_path / "runs" / "a.psk.d"), "s3://bucket/web/shards.json")
    # (a local path still may not leave the tree)
    text_file.write_text('stream "../../outside.psk.d" |> batch(B = 8)\n', encoding="utf-8")
    with pytest.raises(PskdError) as raised:
        load_pipeline(text_file)
    assert raised.value.code == "E9010" and "outside" in raised.value.message


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.pipeline"
    bad.write_text('stream "d"\n|> batch(B = 2x)', encoding="utf-8")
    with pytest.raises(PskdError) as raised:
        load_pipeline(bad)
    assert raised.value.code == "E9010"
    assert raised.value.message.startswith(f"{bad}:2:15: expected ')'")
    with pytest.raises(PskdError) as raised:
        load_pipeline(tmp_path / "missing.pipeline")
    assert raised.value.code == "E9010" and "cannot read the pipeline file" in raised.value.message


def test_a_url_is_not_joined_to_the_base_directory():
    p = parse_pipeline('mix(stream "s3://bucket/web/shards.json" : 1, stream "local.psk.d" : 1) |> batch(B = 2)',
                       base_dir="/data")
    assert p.paths == ("s3://bucket/web/shards.json", "/data/local.psk.d")
