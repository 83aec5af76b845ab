"""``python -m tablestore_cdc``: the ``tablestore-cdc`` command (``commands/app.py``)."""

from tablestore_cdc.commands.app import app

if __name__ == "__main__":  # imported (a walk over the package's modules): nothing runs
    app()
