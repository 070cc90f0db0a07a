"""Starting Spark for the pipeline: settings, the Java check, quiet logs, visible progress.

Local mode (``local[*]``) is the default and needs only a Java runtime; ``--master`` points
the same jobs at any Spark cluster. In local mode the driver binds to 127.0.0.1
(``SPARK_LOCAL_IP``) so nothing listens on an outside interface.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from p2psync.pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MIN_JAVA_MAJOR", "SparkSettings", "Stages", "check_java", "materialize", "start_spark"]

#: Spark 4 runs on Java 17 or 21 (its documented requirement).
MIN_JAVA_MAJOR: Final = 17

JAVA_INSTALL_HINT: Final = (
    "install a Java runtime (Debian/Ubuntu: `apt-get install default-jre-headless`) "
    "or set JAVA_HOME to one"
)

# log4j2 configuration for the driver JVM: warnings and errors only, and not even those from
# loggers that warn for reasons that do not concern a user (no native Hadoop library, a plan
# too long to print in full).
_LOG4J2: Final = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{{1}}: %m%n
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
logger.shutdown.name = org.apache.spark.util.ShutdownHookManager
logger.shutdown.level = off
logger.plantext.name = org.apache.spark.util.SparkStringUtils
logger.plantext.level = error
"""


@dataclass(frozen=True)
class SparkSettings:
    """How to start Spark. The defaults suit one machine."""

    master: str = "local[*]"
    driver_memory: str | None = None
    executor_memory: str | None = None
    #: None leaves Spark's default; adaptive execution coalesces small partitions anyway.
    shuffle_partitions: int | None = None
    #: Spark's console progress bar plus one line per pipeline stage on stderr.
    progress: bool = True
    log_level: str = "WARN"
    app_name: str = "p2psync-pipeline"
    #: Extra options for the driver JVM (in local mode, the JVM that runs every task).
    java_options: str = ""
    extra_conf: dict[str, str] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        return self.master.startswith("local")


def _java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("java")


def check_java() -> int:
    """The major version of the Java runtime Spark will use; :class:`PipelineError` if none fits."""
    java = _java_binary()
    if java is None:
        raise PipelineError(
            "JavaMissing", f"Spark needs Java {MIN_JAVA_MAJOR}+ and none was found: {JAVA_INSTALL_HINT}"
        )
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PipelineError("JavaMissing", f"cannot run {java}: {exc}; {JAVA_INSTALL_HINT}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        raise PipelineError("JavaMissing", f"cannot tell the version of {java}; {JAVA_INSTALL_HINT}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0" is Java 8
        major = int(match.group(2))
    if major < MIN_JAVA_MAJOR:
        raise PipelineError("JavaTooOld", f"{java} is Java {major}; Spark needs {MIN_JAVA_MAJOR}+: {JAVA_INSTALL_HINT}")
    return major


def _log_config(level: str) -> str:
    directory = Path(tempfile.gettempdir()) / "p2psync-spark"
    directory.mkdir(exist_ok=True)
    path = directory / f"log4j2-{level.lower()}.properties"
    text = _LOG4J2.format(level=level.lower())
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)


def start_spark(settings: SparkSettings) -> SparkSession:
    """A SparkSession built from ``settings`` (an active one with the same master is reused)."""
    check_java()
    try:
        from pyspark.sql import SparkSession  # the [pipeline] extra: this module loads without it
    except ImportError as exc:  # pragma: no cover - a broken install
        raise PipelineError("PySparkMissing", f"cannot import pyspark ({exc}); pip install 'pyspark[sql]'") from None
    if settings.local:
        # The driver and its block manager listen on loopback only.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (pandas UDFs) must run this interpreter, which has pyarrow and p2psync.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    conf: dict[str, str] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true" if settings.progress else "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": " ".join(filter(None, (
            f"-Dlog4j2.configurationFile=file:{_log_config(settings.log_level)}", settings.java_options
        ))),
    }
    if settings.local:
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    if settings.driver_memory:
        conf["spark.driver.memory"] = settings.driver_memory
    if settings.executor_memory:
        conf["spark.executor.memory"] = settings.executor_memory
    if settings.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(settings.shuffle_partitions)
    conf.update(settings.extra_conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j/pyspark raise several unrelated types when the JVM fails
        raise PipelineError("SparkStartFailed", f"Spark did not start on {settings.master}: {exc}") from None
    spark.sparkContext.setLogLevel(settings.log_level.upper())
    return spark


def materialize(frame: DataFrame) -> DataFrame:
    """``frame`` computed now and kept (memory, spilling to disk), behind a one-node plan.

    Spark re-analyses a DataFrame's whole plan on every operation and every action; the jobs
    here chain enough joins that, on small inputs, planning costs more than running. Cutting
    the lineage after each step keeps every plan small.
    """
    from pyspark import StorageLevel  # the [pipeline] extra: this module loads without it

    # PySpark's MEMORY_AND_DISK keeps the rows serialized: compact, for the large steps too.
    return frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)


class Stages:
    """Names each stage of a job: a line on stderr and the Spark job description."""

    def __init__(self, spark: SparkSession, job: str, total: int, enabled: bool = True) -> None:
        self.spark = spark
        self.job = job
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.started = time.monotonic()

    def __call__(self, what: str) -> None:
        self.done += 1
        self.spark.sparkContext.setJobDescription(f"{self.job} {self.done}/{self.total}: {what}")
        if self.enabled:
            elapsed = time.monotonic() - self.started
            print(f"[{self.job} {self.done}/{self.total} +{elapsed:.1f}s] {what}", file=sys.stderr, flush=True)
