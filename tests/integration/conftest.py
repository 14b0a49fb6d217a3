"""The process's one Spark session, for the tests that read or write through Delta on Spark in this process."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """Tests that take it share one test process under `make test` (see `tests/conftest.py`); a module adds to
    it by overriding the fixture (registering the sink, S3A settings)."""
    from tests.integration.spark_harness import shared_session

    return shared_session()
