"""The bench chart draws what it is given: one row per writer count, both systems, in SVG or PNG."""

from __future__ import annotations

import random
from pathlib import Path
from xml.etree import ElementTree

import pytest

from deltacoord.tooling.bench_chart import ChartRun, SystemRun, write_chart


def _run(writers: int, dc_rate: float, rs_rate: float, rs_failed: int) -> ChartRun:
    rnd = random.Random(writers)
    return ChartRun(writers, (
        SystemRun("deltacoord", dc_rate, 0, [rnd.lognormvariate(3, 0.4) for _ in range(200)]),
        SystemRun("delta-rs", rs_rate, rs_failed, [rnd.lognormvariate(5, 1.0) for _ in range(150)]),
    ))


def test_svg_has_a_row_per_writer_count_with_ratio_failures_and_both_curves(tmp_path: Path) -> None:
    out = write_chart([_run(1, 80.0, 50.0, 0), _run(16, 210.0, 10.0, 104)], tmp_path / "b.svg")
    text = ElementTree.tostring(ElementTree.parse(out).getroot(), encoding="unicode", method="text")
    assert "1 writer: commits/s (1.6x)" in text and "16 writers: commits/s (21.0x)" in text
    assert "104 failed" in text and "210.0/s" in text
    assert text.count("latency distribution") == 2 and "deltacoord" in text and "delta-rs" in text


def test_png_by_suffix(tmp_path: Path) -> None:
    out = write_chart([_run(4, 100.0, 0.0, 40)], tmp_path / "b.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_to_draw_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no bench runs"):
        write_chart([], tmp_path / "b.svg")


@pytest.mark.parametrize(("blocked", "flags", "says"), [
    (("matplotlib",), [], "deltacoord bench needs matplotlib: pip install 'deltacoord[bench]' (or --no-chart for no chart)"),
    (("deltalake", "matplotlib"), ["--no-chart"], "deltacoord bench needs deltalake: pip install 'deltacoord[bench]'"),
])
def test_the_bench_without_its_extra_says_how_to_install_it_before_running(
        monkeypatch: pytest.MonkeyPatch, blocked: tuple[str, ...], flags: list[str], says: str) -> None:
    # The daemon's install has neither delta-rs nor matplotlib (the `bench` extra): one line, before any broker starts.
    import importlib.util

    from click.testing import CliRunner

    from deltacoord.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in blocked else real(name, *a))
    result = CliRunner().invoke(main, ["bench", "--writers", "1", *flags])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {says}"


def test_the_daemon_does_not_depend_on_the_bench_extra() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "matplotlib" not in core and "deltalake" not in core
    assert {"deltalake==1.6.6", "matplotlib>=3.8"} <= set(project["optional-dependencies"]["bench"])
