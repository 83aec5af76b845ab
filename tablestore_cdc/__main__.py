"""``python -m tablestore_cdc``: the ``tablestore-cdc`` command (``commands/app.py``)."""

from tablestore_cdc.commands.app import app

app()
