"""The installed pandas is one PySpark supports: PySpark's own check of it passes without a warning (with pandas 3
every Spark session and each of its Python workers warned that PySpark does not support it yet)."""

from __future__ import annotations

import re
import warnings
from importlib.metadata import requires, version
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def test_pyspark_accepts_the_installed_pandas_without_a_warning() -> None:
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PySpark's "does not yet fully support pandas" is a FutureWarning
        require_minimum_pandas_version()


def test_the_project_pins_pandas_to_what_pyspark_supports() -> None:
    """pyproject's pandas range lies inside PySpark's: at least PySpark's minimum, below the major it warns about."""
    pins = re.findall(r'"pandas([^"]*)"', (REPO / "pyproject.toml").read_text())
    assert pins, "pyproject.toml names pandas"
    pyspark_min = next(Requirement(r).specifier for r in requires("pyspark") or [] if r.startswith("pandas"))
    for pin in pins:
        spec = Requirement(f"pandas{pin}").specifier
        assert "3.0.0" not in spec and "3.1.1" not in spec, f"pandas{pin} admits pandas 3, which PySpark warns about"
        lowest = re.search(r">=\s*([\d.]+)", pin)
        assert lowest is not None and lowest.group(1) in pyspark_min, f"pandas{pin} starts below PySpark's {pyspark_min}"
    assert version("pandas") in Requirement(f"pandas{pins[0]}").specifier
