"""``python -m tablestore_emulator --store PATH --instance NAME ...``: same as
``tablestore-cdc emulator``."""

import typer

from tablestore_emulator.cli import emulator_command

if __name__ == "__main__":
    typer.run(emulator_command)
