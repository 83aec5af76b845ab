"""Protobuf ``string`` fields checked as UTF-8 where a message is parsed.

Every Tablestore message is proto2, and the protobuf runtime (upb) does not check a proto2
``string`` field's bytes: a field holding invalid UTF-8 parses, and reading it gives ``bytes``
instead of ``str``, which fails much later as a ``UnicodeDecodeError`` or a ``TypeError`` far
from the bytes that caused it. ``invalid_string_field(msg)`` finds such a field right after the
parse, so the parser can refuse the message as malformed.

Called by ``messages.parse`` (the Tunnel client on the driver and executors, and the emulator's
tunnel API) and by the emulator's table API (``tablestore_emulator.table_api``, over the SDK's
generated messages).
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_REPEATED = FieldDescriptor.LABEL_REPEATED


@functools.lru_cache(maxsize=512)
def _holds_strings(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold a ``string`` field at any depth (a ReadRecords
    answer's hundreds of ``Record`` messages hold none: they are not walked)."""
    seen: set[str] = set()
    pending = [descriptor]
    while pending:
        d = pending.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        for field in d.fields:
            if field.type == _STRING:
                return True
            if field.type == _MESSAGE:
                pending.append(field.message_type)
    return False


def invalid_string_field(msg: Any) -> str | None:
    """The path (``channels[2].channel_id``) of the first set ``string`` field of ``msg``, at
    any depth, whose bytes are not UTF-8; ``None`` when every one is text. The depth is the
    parsed message's, which the protobuf runtime bounds (100 levels)."""
    if not _holds_strings(msg.DESCRIPTOR):
        return None
    for field, value in msg.ListFields():
        if field.type == _STRING:
            values = value if field.label == _REPEATED else (value,)
            for i, item in enumerate(values):
                if not isinstance(item, str):
                    return _path(field, i)
        elif field.type == _MESSAGE and _holds_strings(field.message_type):
            if field.message_type.GetOptions().map_entry:
                continue  # no Tablestore message has a map
            values = value if field.label == _REPEATED else (value,)
            for i, item in enumerate(values):
                inner = invalid_string_field(item)
                if inner is not None:
                    return f"{_path(field, i)}.{inner}"
    return None


def _path(field: FieldDescriptor, index: int) -> str:
    return f"{field.name}[{index}]" if field.label == _REPEATED else field.name


__all__ = ["invalid_string_field"]
