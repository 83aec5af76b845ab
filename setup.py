"""The one part of the build pyproject.toml cannot declare: the optional compiled decoder.

``connector.tunnel.tablestore._columnar`` (C, the Python headers only) decodes PlainBuffer
pages straight into Arrow buffers. ``optional=True``: where it does not compile (no C
compiler), the install still succeeds and the pure-Python decoder is used
(``connector.tunnel.tablestore.columnar``; docs/performance.md).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "connector.tunnel.tablestore._columnar",
            ["connector/tunnel/tablestore/_columnar.c"],
            optional=True,
        )
    ]
)
