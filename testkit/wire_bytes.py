"""Protobuf wire bytes written by hand, for tests and fuzz targets that build messages no
encoder would (``testkit.emulator_requests``' nested conditions, tests/test_read_answer.py's
generated answers, tests/fuzz/test_fuzz_emulator_hostile.py's amplified conditions)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """``n`` (not negative) as a protobuf base-128 varint: seven bits a byte, low first."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
