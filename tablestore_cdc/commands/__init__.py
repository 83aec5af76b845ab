"""The ``tablestore-cdc`` command line: every command in one place (the application floor).

``app.py`` mounts them; ``errors.py`` is how each reports a problem (one ``error: ...`` line);
``source_flags.py`` holds the flags that name a source. Each other module is one command or
command group, thin over the library package that does the work (``pipeline``, ``lakehouse``,
``reconcile``, ``resnapshot``, ``feed``, ``dashboard``, the embedded store, the emulator).
"""
