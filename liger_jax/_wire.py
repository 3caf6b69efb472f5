"""Protobuf's wire format, as much as it takes to read and set fields of a serialized message without its schema.

A message is a sequence of fields, each a tag (``number << 3 | wire type``, a varint) and a payload: a varint, 8 or
4 fixed bytes, or a length-prefixed byte string (a string, bytes or a nested message). :func:`fields` splits a
message into ``(number, wire type, payload)`` triples, keeping a varint's or a fixed field's payload as its encoded
bytes, and :func:`encode` joins them again, so what is not touched is written back byte for byte.
"""

from __future__ import annotations

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
Field = tuple[int, int, bytes]


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise ValueError("a varint runs past the end of the message")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position, shift = position + 1, shift + 7
        if not byte & 0x80:
            return value, position


def varint(value: int) -> bytes:
    """``value`` (≥ 0) as a varint."""
    if value < 0:
        raise ValueError(f"varints here are non-negative, got {value}")
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def fields(message: bytes) -> list[Field]:
    """``message``'s fields in order, as ``(number, wire type, payload)``: a length-delimited field's payload is its
    content, any other's its encoded bytes.

    Raises:
        ValueError: the bytes are not a well-formed message (a group, an unknown wire type, a field past the end).
    """
    out, position = [], 0
    while position < len(message):
        tag, position = _read_varint(message, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == VARINT:
            end = _read_varint(message, position)[1]
        elif wire_type in (FIXED64, FIXED32):
            end = position + (8 if wire_type == FIXED64 else 4)
        elif wire_type == LENGTH_DELIMITED:
            length, position = _read_varint(message, position)
            end = position + length
        else:
            raise ValueError(f"field {number} has wire type {wire_type}, which this reader does not take")
        if end > len(message):
            raise ValueError(f"field {number} runs past the end of the message")
        out.append((number, wire_type, message[position:end]))
        position = end
    return out


def encode(message_fields: list[Field]) -> bytes:
    """The message of ``message_fields`` (as :func:`fields` gives them)."""
    out = bytearray()
    for number, wire_type, payload in message_fields:
        out += varint(number << 3 | wire_type)
        if wire_type == LENGTH_DELIMITED:
            out += varint(len(payload))
        out += payload
    return bytes(out)


def field(message: bytes, number: int) -> bytes:
    """The payload of field ``number`` of ``message`` (its last occurrence, as protobuf reads a singular field).

    Raises:
        ValueError: the message has no such field.
    """
    found = [payload for field_number, _, payload in fields(message) if field_number == number]
    if not found:
        raise ValueError(f"the message has no field {number}")
    return found[-1]


def with_field(message: bytes, number: int, wire_type: int, payload: bytes) -> bytes:
    """``message`` with field ``number`` set to ``payload`` (every earlier occurrence dropped, the field appended)."""
    kept = [f for f in fields(message) if f[0] != number]
    return encode([*kept, (number, wire_type, payload)])
