"""The mixture grammar (pskd_jax.pipeline.parse): what parses and to what, the canonical text back,
and errors that name what is wrong with its line and column; mixture files and their directory."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pskd_jax.errors import PskdError
from pskd_jax.pipeline import MixSource, Mixture, Pipeline, load_pipeline, parse_pipeline

TWO = 'mix(stream "a.psk.d" |> shuffle(seed = 1) : 3, stream "b.psk.d" : 1) |> batch(B = 32) |> take(n = 10)'


def test_parse_a_mixture():
    mixture = parse_pipeline(TWO, base_dir="/data")
    expected = (MixSource("/data/a.psk.d", 1, Fraction(3)), MixSource("/data/b.psk.d", None, Fraction(1)))
    assert mixture == Mixture(expected, batch_size=32, take=10)
    assert [s.where for s in mixture.sources] == ["pipeline:1:5", "pipeline:1:48"]
    assert mixture.paths == ("/data/a.psk.d", "/data/b.psk.d")


@pytest.mark.parametrize("text, weights, take", [
    ('mix(stream "a" : 1, stream "b" : 2) |> batch(B = 4)', ["1", "2"], None),
    ('mix(stream"a":0.5,stream"b":0.25,)|>batch(B=4)|>take(n=2)', ["0.5", "0.25"], 2),
    ('data = mix(\n  stream "a" |> shuffle(seed = 0) : 007,\n  stream "b" : 1.500,\n'
     '  stream "c" : 0.001\n) |> batch(B = 4)',
     ["7", "1.5", "0.001"], None),
    ('mix(stream "a" : 123456789012345678901234567890, stream "b" : 123456789012345678901234567890)'
     ' |> batch(B = 1)', ["1", "1"], None),
])
def test_whitespace_is_free_weights_exact_and_a_trailing_comma_allowed(text, weights, take):
    mixture = parse_pipeline(text)
    ratio = [Fraction(w) for w in weights]
    assert [s.weight / mixture.sources[0].weight for s in mixture.sources] == [r / ratio[0] for r in ratio]
    assert mixture.take == take


def test_str_writes_the_canonical_text_back():
    text = 'm = mix(stream "a" : 3.50, stream "b" |> shuffle(seed=2) : 1) |> batch(B=4)'
    mixture = parse_pipeline(text, base_dir="/d")
    assert str(mixture) == 'mix(stream "/d/a" : 3.5, stream "/d/b" |> shuffle(seed = 2) : 1) |> batch(B = 4)'
    assert parse_pipeline(str(mixture)) == mixture
    assert parse_pipeline("d = " + TWO) == parse_pipeline(TWO)


def test_a_single_stream_still_parses_to_a_pipeline():
    single = parse_pipeline('stream "a" |> shuffle(seed = 3) |> batch(B = 2)', base_dir="b")
    assert single == Pipeline("b/a", 3, 2, None)
    assert parse_pipeline('mix = stream "a" |> batch(B = 2)') == Pipeline("a", None, 2, None)  # 'mix' as a name


@pytest.mark.parametrize("text, message", [
    ('mix(stream "a" : 3) |> batch(B = 2)', "1:1: a mix of one source: a mix has two sources or more"),
    ('mix(stream "a" : 0, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight must be a positive number (such as 3 or 0.25), got 0"),
    ('mix(stream "a" : 0.000, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight must be a positive number (such as 3 or 0.25), got 0.000"),
    ('mix(stream "a" : -2, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight must be a positive number (such as 3 or 0.25), got -2"),
    ('mix(stream "a" : x, stream "b" : 1) |> batch(B = 2)',
     "1:18: expected a weight, a positive number (such as 3 or 0.25), after ':', found 'x'"),
    ('mix(stream "a" : , stream "b" : 1) |> batch(B = 2)', "1:18: expected a weight"),
    ('mix(stream "a", stream "b" : 1) |> batch(B = 2)',
     '1:15: missing weight: expected \': WEIGHT\' after stream "a" (each source of a mix has a weight), found \',\''),
    ('mix(stream "a" |> shuffle(seed = 1), stream "b" : 1) |> batch(B = 2)',
     "1:36: missing weight: expected ': WEIGHT' after shuffle(seed = 1)"),
    ('mix(stream "a" 2, stream "b" : 1) |> batch(B = 2)', "1:16: missing weight"),
    ('mix(mix(stream "a" : 1, stream "c" : 1) : 1, stream "b" : 1) |> batch(B = 2)', "1:5: a mix inside a mix"),
    ('mix(stream "a" : 1,\n  mix(stream "a" : 1, stream "c" : 1) : 1) |> batch(B = 2)', "2:3: a mix inside a mix"),
    ('mix(stream "a" |> batch(B = 2) : 1, stream "b" : 1) |> batch(B = 2)',
     "1:19: batch inside a mix's source: batch and take apply to the whole mix"),
    ('mix(stream "a" |> shuffle(seed = 1) |> take(n = 2) : 1, stream "b" : 1) |> batch(B = 2)',
     "1:40: take inside a mix's source"),
    ('mix(stream "a" |> shuffle(seed = 1) |> shuffle(seed = 2) : 1, stream "b" : 1) |> batch(B = 2)',
     "1:40: duplicate stage 'shuffle'"),
    ('mix(stream "a" |> repeat(n = 1) : 1, stream "b" : 1) |> batch(B = 2)',
     "1:19: expected 'shuffle' after '|>' in a mix's source, found 'repeat'"),
    ('mix(stream "a" : 1e5, stream "b" : 1) |> batch(B = 2)', "1:18: weight 1e5…: a weight has no exponent"),
    ('mix(stream "a" : 2.5E-3, stream "b" : 1) |> batch(B = 2)', "1:18: weight 2.5E…: a weight has no exponent"),
    # Hex, underscores and the like glued to the digits: named whole, never read as the digits before them
    # ('0x1' was "weight must be a positive number …, got 0").
    ('mix(stream "a" : 0x1, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight 0x1…: a weight is written in decimal digits (such as 3 or 0.25)"),
    ('mix(stream "a" : 1_000, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight 1_000…: a weight is written in decimal digits (such as 3 or 0.25)"),
    ('mix(stream "a" : 0.5f, stream "b" : 1) |> batch(B = 2)',
     "1:18: weight 0.5f…: a weight is written in decimal digits (such as 3 or 0.25)"),
    ('mix(stream "a" : 1., stream "b" : 1) |> batch(B = 2)',
     "1:20: expected the digits after the decimal point of weight 1., found ','"),
    ('mix(stream "a" : 1 . 5, stream "b" : 1) |> batch(B = 2)',
     "1:20: expected ',' or ')' after the weight 1, found '.'"),
    ('mix(stream "a" : .5, stream "b" : 1) |> batch(B = 2)', "1:18: expected a weight"),
    ('mix(stream "a" : 1/2, stream "b" : 1) |> batch(B = 2)',
     "1:19: expected ',' or ')' after the weight 1, found '/'"),
    ('mix(stream "a" : 1 stream "b" : 1) |> batch(B = 2)',
     "1:20: expected ',' or ')' after the weight 1, found 'stream'"),
    ('mix() |> batch(B = 2)',
     "1:5: expected a source (stream \"…\" [|> shuffle(seed = s)] : weight) after mix(, found ')'"),
    ('mix(stream "a" : 1,, stream "b" : 1) |> batch(B = 2)', "1:20: expected a source"),
    ('mix stream "a" : 1', "1:5: expected '(' after mix, found 'stream'"),
    ('mix(stream "a" : 1, stream "b" : 1', "1:35: expected ',' or ')' after the weight 1, found the end of the text"),
    ('mix(stream "a" : 1, stream "b" : 1)', "1:36: expected '|> batch(B = n)' after mix(…): every pipeline batches"),
    ('mix(stream "a" : 1, stream "b" : 1) |> take(n = 2)', "1:51: expected '|> batch(B = n)' after take(n = 2)"),
    ('mix(stream "a" : 1, stream "b" : 1) |> shuffle(seed = 1) |> batch(B = 2)',
     "1:40: shuffle after a mix: each source shuffles itself"),
    ('mix(stream "a" : 1, stream "b" : 1) |> take(n = 1) |> batch(B = 2)',
     "1:55: stage 'batch' must come before 'take'"),
    ('mix(stream "a" : 1, stream "b" : 1) |> batch(B = 0)', "1:50: B must be an integer >= 1, got B = 0"),
    # A batch of more positions than a mixture's stream has (2**63 - 1) would make none: never a stream of none.
    ('mix(stream "a" : 1, stream "b" : 1) |> batch(B = 9223372036854775808)',
     "1:50: B must be at most 9223372036854775807 (2**63 - 1) in a mix, got B = 9223372036854775808"),
    ('mix(stream "" : 1, stream "b" : 1) |> batch(B = 2)', "1:12: expected a non-empty path"),
    ('mix(stream "a" : 1, stream "b" : 0.0000000001) |> batch(B = 2)',
     "1:1: the weights are 10000000000, 1 as coprime integers"),
    ('mix(stream "a" : 1, stream "b" : ' + "1" * 41 + ') |> batch(B = 2)',
     "1:34: weight 11111111111111111111… has 41 characters"),
    # One file in one order twice: each of its samples would come twice in a row.
    ('mix(stream "a" : 1, stream "b" : 1, stream "./a" : 2) |> batch(B = 2)',
     "1:37: source 2 streams './a' unshuffled, as source 0 does: the mix would give each of its samples twice"),
    ('mix(stream "a" |> shuffle(seed = 3) : 1, stream "a" |> shuffle(seed = 3) : 1) |> batch(B = 2)',
     "1:42: source 1 streams 'a' shuffled with seed 3, as source 0 does"),
])
def test_errors_name_what_is_wrong_with_line_and_column(text, message):
    with pytest.raises(PskdError) as raised:
        parse_pipeline(text)
    assert raised.value.code == "E9010"
    assert f"pipeline:{message}" in raised.value.message, raised.value.message


def test_one_file_spelt_two_ways_in_one_order_is_refused(tmp_path):
    """Two spellings of one file or object (a URL's scheme in capitals, a file:// URL of a relative
    path, an absolute path) were two sources: each sample came twice in a row, which the mix
    refuses for one spelling."""
    for first, second in (("s3://bkt/c/shards.json", "S3://bkt/c/shards.json"),
                          ("a.psk.d", f"file://{tmp_path}/a.psk.d"), ("a.psk.d", f"{tmp_path}/./a.psk.d")):
        text = f'mix(stream "{first}" : 1, stream "{second}" : 1) |> batch(B = 2)'
        with pytest.raises(PskdError, match="E9010: pipeline:1:.*: source 1 streams '.*' unshuffled, as source 0 does"):
            parse_pipeline(text, base_dir=tmp_path)
    distinct = 'mix(stream "s3://bkt/c/shards.json" : 1, stream "s3://bkt/d/shards.json" : 1) |> batch(B = 2)'
    assert len(parse_pipeline(distinct).sources) == 2


def test_one_file_in_two_orders_is_two_sources():
    text = ('mix(stream "a" |> shuffle(seed = 1) : 1, stream "a" |> shuffle(seed = 2) : 1, stream "a" : 1) '
            '|> batch(B = 2)')
    assert len(parse_pipeline(text).sources) == 3


def test_a_mix_of_too_many_sources_is_refused():
    text = "mix(" + ", ".join(f'stream "a{k}" : 1' for k in range(257)) + ") |> batch(B = 1)"
    with pytest.raises(PskdError) as raised:
        parse_pipeline(text)
    assert raised.value.code == "E9010" and "at most 256 sources" in raised.value.message
    assert len(parse_pipeline(text.replace('stream "a0" : 1, ', "", 1)).sources) == 256


def test_a_mixture_file_streams_only_inside_its_directory_or_root(tmp_path):
    (tmp_path / "runs").mkdir()
    text_file = tmp_path / "runs" / "mix.pipeline"
    text_file.write_text('mix(stream "a.psk.d" : 1,\n    stream "../b.psk.d" : 1) |> batch(B = 2)\n', encoding="utf-8")
    with pytest.raises(PskdError) as raised:
        load_pipeline(text_file)
    assert raised.value.code == "E9010" and "../b.psk.d" in raised.value.message and "outside" in raised.value.message
    mixture = load_pipeline(text_file, root=tmp_path)
    assert mixture.paths == (str(tmp_path / "runs" / "a.psk.d"), str(tmp_path / "runs" / "../b.psk.d"))
    assert mixture.sources[1].where == f"{text_file}:2:5"
    text_file.write_text('mix(stream "a.psk.d" : 1,\n    stream "b.psk.d" : 0) |> batch(B = 2)\n', encoding="utf-8")
    with pytest.raises(PskdError) as raised:
        load_pipeline(text_file)
    assert raised.value.message.startswith(f"{text_file}:2:24: weight must be a positive number")


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

paths = st.text(st.sampled_from("ab/._-é x"), min_size=1, max_size=12)
weights = st.builds(lambda whole, part, places: Fraction(whole) + Fraction(part, 10**places),
                    st.integers(0, 10**6), st.integers(1, 999), st.integers(3, 6))
mix_sources = st.builds(MixSource, paths, st.one_of(st.none(), st.integers(0, 2**64 - 1)), weights)


@settings(max_examples=60, deadline=None)
@given(st.lists(mix_sources, min_size=2, max_size=5), st.integers(1, 10**6), st.one_of(st.none(), st.integers(1, 99)))
def test_the_canonical_text_of_any_mixture_parses_back_to_it(sources, batch_size, take):
    try:
        mixture = Mixture(tuple(sources), batch_size=batch_size, take=take)
    except PskdError as refused:  # weights of too many digits together, or one file in one order twice
        assert "2**31 - 1" in refused.message or "2**20" in refused.message or "twice in a row" in refused.message
        return
    assert parse_pipeline(str(mixture)) == mixture


def test_a_mix_of_the_largest_batch_has_one_batch():
    mixture = parse_pipeline('mix(stream "a" : 1, stream "b" : 1) |> batch(B = 9223372036854775807)')
    assert mixture.batch_size == 2**63 - 1 and mixture.end_batch == 1
