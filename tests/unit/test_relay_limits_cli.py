"""`deltacoord relay run` takes its limits from the command line and refuses ones that cannot work, before Kafka."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from deltacoord.cli.main import main
from deltacoord.writer.relay_limits import RelayLimits


def test_defaults_are_shown_and_bounded() -> None:
    out = CliRunner().invoke(main, ["relay", "run", "--help"]).output
    for flag in ("--max-frame-bytes", "--max-buffered-bytes", "--max-connections", "--frame-timeout-seconds"):
        assert flag in out, out
    d = RelayLimits()
    assert d.max_frame_bytes == 8 * 1024 * 1024 and d.max_frame_bytes <= d.max_buffered_bytes
    assert str(d.max_frame_bytes) in out and str(d.max_connections) in out


def test_a_frame_limit_over_the_buffer_is_refused() -> None:
    res = CliRunner().invoke(main, ["relay", "run", "--socket", "/tmp/never-used.sock", "--bootstrap-servers",
                                    "127.0.0.1:1", "--max-frame-bytes", "1000", "--max-buffered-bytes", "10"])
    assert res.exit_code == 2 and "max_frame_bytes (1000) must not exceed max_buffered_bytes (10)" in res.output, res.output


@pytest.mark.parametrize("field", ["max_frame_bytes", "max_buffered_bytes", "max_connections", "frame_timeout_s"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field} must be above 0"):
        RelayLimits(**{field: 0})
