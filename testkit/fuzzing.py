"""What the fuzz targets share (``tests/fuzz/``): how long they run, and byte mutations.

Each fuzz target is a hypothesis test marked ``fuzz`` that feeds input the product does not
control (a server's pages and records, option values, requests to the emulator) to the code
that parses it, and asserts that the outcome is a result or the product's typed error (or a
4xx), never a raw Python error. In the default suite each runs a bounded number of inputs
(seconds); ``make fuzz`` runs them long:

- ``FUZZ_EXAMPLES``: inputs per target (default ``DEFAULT_EXAMPLES``; ``make fuzz`` sets
  20000). Hypothesis keeps the failing inputs it found in ``.hypothesis/`` and tries them
  first next time; ``--hypothesis-show-statistics`` reports the inputs tried per target.

``mutated(data)`` is a strategy of byte strings derived from ``data`` by a few random edits
(flips, overwrites with interesting bytes, inserts, deletes, truncation, duplicated spans): the
input a corrupting proxy or a buggy server would send, close enough to valid to get deep.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

#: inputs per fuzz target in the default suite (a few seconds each)
DEFAULT_EXAMPLES = 200
#: bytes that break parsers: length and tag bytes, sign bits, UTF-8 lead and continuation bytes
INTERESTING = [0x00, 0x01, 0x02, 0x03, 0x05, 0x07, 0x09, 0x0A, 0x0B, 0x7F, 0x80, 0xBF, 0xC0,
               0xC3, 0xE0, 0xED, 0xF4, 0xF8, 0xFE, 0xFF]


def examples(default: int = DEFAULT_EXAMPLES) -> int:
    """Inputs per target: ``FUZZ_EXAMPLES`` when set (``make fuzz``), else ``default``."""
    return int(os.environ.get("FUZZ_EXAMPLES") or default)


def fuzz_settings(default: int = DEFAULT_EXAMPLES) -> Any:
    """The hypothesis settings of a fuzz target: ``examples()`` inputs, no deadline (a slow
    input is not a failure here), health checks on generated data off."""
    return settings(max_examples=examples(default), deadline=None,
                    # no "explain" phase: re-running a failure to explain it can take minutes
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target,
                            Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


def mostly(usual: Any, rare: Any, one_in: int = 10) -> Any:
    """``usual``, and about once in ``one_in`` draws ``rare`` (``st.one_of`` weighs its
    branches alike and merges repeated ones, and a drawn integer hits its bounds far more often
    than its share: ``sampled_from`` is what picks evenly)."""
    return st.sampled_from([False] * (one_in - 1) + [True]).flatmap(
        lambda is_rare: rare if is_rare else usual)


@st.composite
def mutated(draw: Any, data: bytes, max_edits: int = 4) -> bytes:
    """``data`` after 0 to ``max_edits`` random edits (module docstring)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(0, max_edits))):
        how = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "repeat"]))
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if how == "insert" or not out:
            out[at:at] = draw(st.binary(min_size=1, max_size=4)
                              | st.sampled_from(INTERESTING).map(lambda b: bytes([b])))
        elif how == "flip":
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "set":
            out[at] = draw(st.sampled_from(INTERESTING) | st.integers(0, 255))
        elif how == "delete":
            del out[at:at + draw(st.integers(1, 4))]
        elif how == "truncate":
            del out[at:]
        else:
            span = bytes(out[at:at + draw(st.integers(1, 16))])
            out[at:at] = span * draw(st.integers(1, 3))
    return bytes(out)


__all__ = ["DEFAULT_EXAMPLES", "INTERESTING", "examples", "fuzz_settings", "mostly", "mutated"]
