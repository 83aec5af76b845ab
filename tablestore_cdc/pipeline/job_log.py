"""Where a long-running job's Spark log goes (driver): to a file in its output directory, not
to the operator's console, which keeps the job's own one-line messages.

Spark's JVM log (WARN and above) and the Python side's Py4J log go to ``OUTPUT/logs/spark.log``
(a directory of this machine for an output in object storage)
through a log4j2 configuration written there (Spark reads it when its JVM starts); the console
gets none of it, so a stop (Ctrl-C, SIGTERM) prints no Spark stack. The CLI prints the path.
"""

from __future__ import annotations

import logging
from pathlib import Path

_CONFIG = """\
# written by tablestore-cdc replicate: Spark's log into {log}, nothing on the console
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss}} %p %c{{1}}: %m%n
"""


def spark_log_to_file(logs: Path) -> tuple[Path, dict[str, str]]:
    """The log file's path in the directory ``logs`` (``OUTPUT/logs``; for an output in
    object storage, a local one: ``output.JobOutput.logs_dir``) and the Spark conf that sends
    the JVM's log there; the Py4J log of this process goes there too."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "spark.log"
    config = logs / "log4j2.properties"
    config.write_text(_CONFIG.format(log=log), encoding="utf-8")
    handler = logging.FileHandler(log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    py4j = logging.getLogger("py4j")
    py4j.addHandler(handler)
    py4j.propagate = False
    # as a URI: a space in the path would split the JVM options
    return log, {"spark.driver.extraJavaOptions":
                 f"-Dlog4j2.configurationFile={config.resolve().as_uri()}"}
