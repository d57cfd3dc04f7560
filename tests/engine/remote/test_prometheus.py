"""Prometheus text format read exactly: the lines vLLM's /metrics writes (prometheus_client's format 0.0.4),
and the corners of the format spec (https://prometheus.io/docs/instrumenting/exposition_formats/)."""

from __future__ import annotations

import math

import pytest

from engine.remote.prometheus import difference, parse

VLLM = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} 40.0
vllm:spec_decode_num_drafts_total{model_name="m",engine="1"} 2.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{model_name="m",engine="0"} 1.7540001234e+09
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="0",position="1"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",engine="1",position="0"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="m"} 0.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 41.0
"""


def test_samples_types_and_help_are_read_as_written():
    scrape = parse(VLLM)
    assert scrape.types["vllm:spec_decode_num_drafts_total"] == "counter"
    assert scrape.types["vllm:e2e_request_latency_seconds"] == "histogram"
    assert scrape.help["vllm:spec_decode_num_drafts_total"] == "Number of spec decoding drafts."
    first = scrape.samples[0]
    assert (first.name, first.labels, first.value) == (
        "vllm:spec_decode_num_drafts_total",
        (("engine", "0"), ("model_name", "m")),
        40.0,
    )
    assert scrape.matching("vllm:spec_decode_num_drafts_created")[0].value == 1754000123.4


def test_a_metric_sums_over_engines_and_filters_by_label():
    scrape = parse(VLLM)
    assert scrape.total("vllm:spec_decode_num_drafts_total") == 42.0
    assert scrape.total("vllm:spec_decode_num_drafts_total", engine="1") == 2.0
    assert scrape.total("vllm:spec_decode_num_drafts_total", engine="7") is None
    assert scrape.total("vllm:absent_total") is None
    assert scrape.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {"0": 31.0, "1": 25.0}


def test_the_difference_of_two_scrapes_is_what_happened_between_them():
    before, after = parse(VLLM), parse(VLLM.replace("} 40.0", "} 47.0"))
    assert difference(before, after, "vllm:spec_decode_num_drafts_total") == 7.0
    assert difference(after, before, "vllm:spec_decode_num_drafts_total") is None  # fell: the server restarted
    assert difference(before, parse(""), "vllm:spec_decode_num_drafts_total") is None


def test_escapes_timestamps_special_values_and_trailing_commas():
    scrape = parse(
        "# a comment\n\n# HELP x line\\nbreak and \\\\ backslash\n"
        'x{path="C:\\\\dir\\\\",quote="say \\"hi\\"",nl="a\\nb",} 1.5e3 1700000000000\n'
        "y +Inf\nz -Inf\nw NaN\nv{} 0\n"
    )
    x = scrape.samples[0]
    assert dict(x.labels) == {"path": "C:\\dir\\", "quote": 'say "hi"', "nl": "a\nb"}
    assert (x.value, x.timestamp_ms) == (1500.0, 1700000000000)
    assert scrape.help["x"] == "line\nbreak and \\ backslash"
    assert [s.value for s in scrape.samples[1:3]] == [math.inf, -math.inf] and math.isnan(scrape.samples[3].value)
    assert scrape.samples[4].labels == () and scrape.samples[4].value == 0.0


@pytest.mark.parametrize(
    "line", ['x{a="1"', "x{a=1} 2", 'x{a="\\q"} 1', "x", "x 1 2 3", 'x{a="1"}2', "x 1_000", "9x 1", "x one"]
)
def test_a_line_that_is_not_the_format_is_refused_with_its_number(line):
    with pytest.raises(ValueError, match="line 2 of the metrics"):
        parse(f"ok 1\n{line}\n")
