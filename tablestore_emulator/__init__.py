"""A local Tablestore emulator: Tablestore's HTTP/protobuf wire protocol over the embedded store.

See docs/emulator.md.
"""
