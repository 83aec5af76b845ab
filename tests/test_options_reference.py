"""docs/options.md's option table and error samples are what the code says.

Both are generated (``testkit/options_reference.py``) from the option definitions and from
really raising each error; this test fails when the file differs from what they render now, as
tests/test_layering.py fails on an import that goes the wrong way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from connector.options import OPTIONS, SourceOptions
from testkit.options_reference import WRITE_COMMAND, main, option_table, render

OPTIONS_MD = Path(__file__).resolve().parent.parent / "docs" / "options.md"


def test_docs_options_md_is_generated_from_the_definitions() -> None:
    page = OPTIONS_MD.read_text()
    assert render(page) == page, (
        f"docs/options.md differs from the option definitions; run: {WRITE_COMMAND}")


def test_every_option_and_field_is_in_the_table() -> None:
    table = option_table()
    for name in OPTIONS:
        assert f"| `{name}` |" in table
    assert {spec.field for spec in OPTIONS.values()} == set(SourceOptions.model_fields)


def test_drift_is_reported_with_the_command_that_fixes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "options.md"
    stale = OPTIONS_MD.read_text().replace("](#maxoffsetsperchannel) | integer | `10000` |",
                                           "](#maxoffsetsperchannel) | integer | `5000` |", 1)
    assert stale != OPTIONS_MD.read_text()
    page.write_text(stale)
    assert main(["--check", str(page)]) == 1
    assert WRITE_COMMAND in capsys.readouterr().err
    assert main(["--write", str(page)]) == 0
    assert page.read_text() == OPTIONS_MD.read_text()
    assert main(["--check", str(page)]) == 0


def test_hand_written_text_around_the_parts_is_kept() -> None:
    page = ("# Title\n\nprose\n<!-- BEGIN generated: option-table -->\nold\n"
            "<!-- END generated: option-table -->\nmore prose\n")
    rendered = render(page)
    assert rendered.startswith("# Title\n\nprose\n<!-- BEGIN generated: option-table -->\n")
    assert rendered.endswith("<!-- END generated: option-table -->\nmore prose\n")
    assert "old" not in rendered and "| `endpoint` |" in rendered
    with pytest.raises(ValueError, match="unknown generated part"):
        render("<!-- BEGIN generated: nope -->\n<!-- END generated: nope -->\n")
