"""One SparkSession for every pipeline test.

local[2] with no UI, and settings for tiny inputs on a busy 2-core machine: one shuffle
partition, no adaptive re-planning and no code generation (compiling generated code costs
more than running it on a few hundred rows), and a JVM that does not spend its time
optimising code it will run only briefly.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from p2psync.pipeline.session import SparkSettings, start_spark

TEST_SETTINGS = SparkSettings(
    master="local[2]",
    shuffle_partitions=1,
    progress=False,
    log_level="ERROR",
    app_name="p2psync-tests",
    java_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    extra_conf={
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        "spark.default.parallelism": "2",
        # pack the tests' many tiny export files into a couple of read tasks
        "spark.sql.files.openCostInBytes": "1024",
    },
)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = start_spark(TEST_SETTINGS)
    yield session
    session.stop()
