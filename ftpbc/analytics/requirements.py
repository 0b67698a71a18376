"""What ``ftpbc aggregate`` needs besides ftpbc itself, checked before any listing or Spark start.

Without these checks a missing extra surfaced as an ``ImportError`` traceback from deep inside
the job, and a missing Java as Spark's ``JAVA_GATEWAY_EXITED`` after seconds of start-up.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from ftpbc.errors import MissingDependency

#: the modules of the ``spark`` extra the job imports (pyproject.toml [project.optional-dependencies])
SPARK_MODULES = ("pyspark", "pyarrow", "matplotlib")
#: what the plain engine needs of them (Parquet and CSV outputs, the chart): no Spark, no Java
PLAIN_MODULES = ("pyarrow", "matplotlib")
#: the Java release that both Spark 3.5 and Spark 4 run on
JAVA = "Java 17"


def require_modules(modules: tuple[str, ...] = SPARK_MODULES) -> None:
    """MissingDependency naming the first of ``modules`` that cannot be imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise MissingDependency(f"{name} is not installed ({exc}): pip install 'ftpbc[spark]'") from None


def require_java(environ: Mapping[str, str] | None = None) -> str:
    """The ``java`` Spark will start (``$JAVA_HOME/bin/java``, else the first on PATH), or
    MissingDependency saying that Spark needs Java 17 and where it looked."""
    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if os.access(java, os.X_OK):
            return str(java)
        raise MissingDependency(f"JAVA_HOME={home} has no bin/java: Spark needs {JAVA}; point JAVA_HOME "
                                "at a Java 17 installation or unset it to use the java on PATH")
    found = shutil.which("java", path=env.get("PATH", os.defpath))
    if found is None:
        raise MissingDependency(f"no java on PATH and JAVA_HOME is not set: Spark needs {JAVA} "
                                "(e.g. apt-get install openjdk-17-jre-headless, or set JAVA_HOME)")
    return found
