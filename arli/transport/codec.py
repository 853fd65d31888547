"""Wire codec: msgpack maps with raw numpy buffers, versioned, schema-checked on receipt.

A message is one msgpack map ``{"v": PROTOCOL_VERSION, "kind": <str>, ...fields}``. Arrays
travel as msgpack extension type ``NDARRAY_EXT``: a 2-byte header length, a small msgpack
header ``[dtype, shape]`` and the array's raw C-order bytes; or, with ``encode_frames``, as
``NDARRAY_FRAME_EXT`` ``[dtype, shape, frame index]`` whose bytes are a separate ZeroMQ
frame sent without copying (images). Zero pickling, zero code execution on decode, and
only dtypes from ``DTYPES``. ``decode`` checks, in this order: the frame size, that it
parses, the version, the kind, then every field against ``SCHEMAS[kind]``; any failure is a
``ProtocolError`` whose ``code`` says which (``too_large``, ``malformed``, ``version``,
``unknown_kind``, ``schema``) and whose message names the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 2  # 2: infer carries the scheduler's execute_horizon
NDARRAY_EXT = 1
NDARRAY_FRAME_EXT = 2  # header [dtype, shape, frame index]: the bytes travel as their own ZMQ frame
OUT_OF_BAND_BYTES = 32 * 1024  # arrays this large go out of band (zero-copy) in encode_frames
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # default frame limit (two 224x224x3 images are 0.3 MB)
MAX_NDIM = 6
DTYPES = ("float32", "float64", "uint8", "int32", "int64", "bool")
ERROR_CODES = ("too_large", "malformed", "version", "unknown_kind", "schema", "policy", "busy", "internal")


class ProtocolError(ValueError):
    """A message that cannot be accepted; ``code`` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str, request_id: int | None = None):
        super().__init__(f"[{code}] {message}")
        # the refused message's request id when it had one: the error reply then names the
        # request, so the robot gives it up at once instead of at its timeout
        self.code, self.detail, self.request_id = code, message, request_id


# -- arrays ----------------------------------------------------------------------------------
_ITEMSIZE = {name: np.dtype(name).itemsize for name in DTYPES}


# dtype -> wire name by hash lookup: ``ndarray.dtype.name`` is computed in Python by numpy
# and was a third of the encoder's time. Native byte order only (see ``_sendable``).
_WIRE_NAME = {np.dtype(name): name for name in DTYPES}


def _sendable(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """``arr`` as a plain C-contiguous native-order ndarray (itself when it is one already) and
    its wire dtype name; TypeError otherwise."""
    name = _WIRE_NAME.get(arr.dtype)
    if name is not None and type(arr) is np.ndarray and arr.flags.c_contiguous:
        return arr, name
    if name is None:
        if arr.dtype.name not in DTYPES:
            raise TypeError(f"cannot send arrays of dtype {arr.dtype}; allowed: {DTYPES}")
        # a byte-swapped array: its raw bytes would be read back as native-order garbage
        arr, name = arr.astype(arr.dtype.newbyteorder("=")), arr.dtype.name
    # asarray, not ascontiguousarray (which makes a 0-d array 1-d); a subclass (a masked
    # array) sends its raw data
    return np.asarray(arr, order="C"), name


_HEADER_CACHE_SIZE = 512  # entries of each header cache (packed on send, checked on receipt)

# packed array headers by (dtype name, shape[, frame index]): a robot sends the same few
# arrays every request, so each header is packed once, not once per request
_PACKED: dict[tuple, bytes] = {}


def _packed_header(key: tuple) -> bytes:
    hit = _PACKED.get(key)
    if hit is None:
        if len(_PACKED) >= _HEADER_CACHE_SIZE:  # a sender cycling through shapes cannot grow it without bound
            _PACKED.clear()
        header = msgpack.packb([key[0], list(key[1]), *key[2:]])
        # NDARRAY_EXT: [u16 header length][header], so the header is parsed without scanning the data
        hit = _PACKED[key] = header if len(key) == 3 else len(header).to_bytes(2, "little") + header
    return hit


def _pack_array(arr: np.ndarray) -> msgpack.ExtType:
    name = _WIRE_NAME.get(arr.dtype) if type(arr) is np.ndarray else None
    if name is None:  # another byte order, a subclass, or a dtype not sent (TypeError)
        arr, name = _sendable(arr)
    # tobytes writes C order whatever the strides: no contiguous copy first (the reply is packed
    # right after the policy call, where every extra numpy call costs several times its warm time)
    return msgpack.ExtType(NDARRAY_EXT, _packed_header((name, arr.shape)) + arr.tobytes())


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _pack_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}; send numbers, strings, bytes, lists, "
                    "dicts or numpy arrays")


_HEADERS: dict[tuple[int, bytes], tuple[np.dtype, tuple[int, ...], int, int]] = {}  # checked array headers
_NP_DTYPES = {name: np.dtype(name) for name in DTYPES}


def _array_header(code: int, raw: bytes) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """A checked array header -> (dtype, shape, nbytes, frame index or -1). A robot's requests
    repeat the same few headers, so each distinct header is parsed and checked once and then
    looked up by its bytes (the parse was a quarter of the decoder's time)."""
    key = (code, raw)
    hit = _HEADERS.get(key)
    if hit is not None:
        return hit
    try:
        header = msgpack.unpackb(raw, max_array_len=MAX_NDIM + 2, max_str_len=16, max_bin_len=0,
                                 max_map_len=0, max_ext_len=0)
    except Exception as exc:  # any parse failure of the header is the sender's fault
        raise ProtocolError("malformed", f"bad array header: {exc}") from None
    n_fields = 2 if code == NDARRAY_EXT else 3
    if not (isinstance(header, list) and len(header) == n_fields and isinstance(header[0], str)
            and isinstance(header[1], list)):
        raise ProtocolError("malformed", "array header must be [dtype, shape]" + ("" if n_fields == 2 else " + frame"))
    dtype, shape = header[0], header[1]
    if dtype not in DTYPES:
        raise ProtocolError("malformed", f"array dtype {dtype!r} not allowed; allowed: {DTYPES}")
    if len(shape) > MAX_NDIM or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31
                                        for s in shape):
        raise ProtocolError("malformed", f"bad array shape {shape!r}")
    index = -1
    if code == NDARRAY_FRAME_EXT:
        index = header[2]
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ProtocolError("malformed", f"array refers to frame {index!r}")
    # the dtype object, not its name: building an array from a name parses it every time
    parsed = (_NP_DTYPES[dtype], tuple(shape), math.prod(shape) * _ITEMSIZE[dtype], index)
    if len(_HEADERS) >= _HEADER_CACHE_SIZE:  # a sender cycling through shapes cannot grow it without bound
        _HEADERS.clear()
    _HEADERS[key] = parsed
    return parsed


def _ext_hook(buffers: list | None, used: set | None, code: int, data: bytes) -> np.ndarray:
    # arrays are built by one ``np.ndarray`` call on the received bytes (no copy): the decoder
    # runs right after the server wakes for a request, where each numpy call it makes costs
    # several times its warm time (reports/transport.md), and frombuffer + reshape were two
    if code == NDARRAY_FRAME_EXT and buffers is not None:
        dtype, shape, expected, index = _HEADERS.get((code, data)) or _array_header(code, data)
        if index >= len(buffers) or index in used:
            raise ProtocolError("malformed", f"array refers to frame {index!r}; the message has {len(buffers)} "
                                "unused data frames")
        used.add(index)
        buf = buffers[index]
        if expected != len(buf):
            raise ProtocolError("malformed", f"array of shape {list(shape)} {dtype} needs {expected} bytes, its "
                                f"frame has {len(buf)}")
        return np.ndarray(shape, dtype, buf)
    if code != NDARRAY_EXT:
        raise ProtocolError("malformed", f"unknown extension type {code}")
    if len(data) < 2:
        raise ProtocolError("malformed", "array extension shorter than its header length")
    offset = 2 + int.from_bytes(data[:2], "little")
    raw = data[2:offset]
    dtype, shape, expected, _ = _HEADERS.get((code, raw)) or _array_header(code, raw)
    if offset > len(data) or expected != len(data) - offset:
        raise ProtocolError("malformed", f"array of shape {list(shape)} {dtype} needs {expected} bytes, "
                            f"got {len(data) - offset}")
    return np.ndarray(shape, dtype, data, offset)


# -- schemas ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    """One field's type: ``kind`` in {int, float, str, bool, bytes, array, dict, list, any};
    arrays may fix ``ndim`` and ``dtype`` (``float`` accepts float32/float64)."""

    kind: str
    required: bool = True
    ndim: int | None = None
    dtype: str | None = None
    nullable: bool = False


_PY = {"int": int, "str": str, "bool": bool, "bytes": bytes, "dict": dict, "list": list}

SCHEMAS: dict[str, dict[str, Field]] = {
    # inference: robot <-> server
    "hello": {"role": Field("str"), "client": Field("dict", required=False)},
    "hello_ok": {"meta": Field("dict")},
    "ping": {"sent": Field("float")},
    "pong": {"sent": Field("float"), "server_time": Field("float")},
    "infer": {
        "request_id": Field("int"), "t0": Field("int"), "capture_ts": Field("float"),
        "state": Field("array", ndim=1, dtype="float"),
        "images": Field("dict", required=False),  # name -> (h, w, 3) uint8
        "history": Field("list", required=False),  # earlier control steps: [{state, images}]
        "instruction": Field("str", required=False),
        "delay_steps": Field("int"),
        "committed_prefix": Field("array", ndim=2, dtype="float", required=False, nullable=True),
        "guidance": Field("array", ndim=2, dtype="float", required=False, nullable=True),
        "execute_horizon": Field("int", required=False, nullable=True),  # the scheduler's s (RTC mask)
        "episode": Field("int", required=False),
    },
    "chunk": {"request_id": Field("int"), "actions": Field("array", ndim=2, dtype="float"),
              "timing": Field("dict")},
    "error": {"code": Field("str"), "message": Field("str"), "request_id": Field("int", required=False,
                                                                                nullable=True)},
    # learner <-> actors
    "transitions": {"actor_id": Field("str"), "seq": Field("int"), "rows": Field("array", ndim=2, dtype="float"),
                    "episodes": Field("list", required=False),
                    "last": Field("bool", required=False),  # the actor's last batch: it has stopped
                    # a batch its spool dropped (the learner was away too long): no rows, this many lost
                    "dropped": Field("int", required=False),
                    # with ``dropped``: the placeholder stands for every seq from ``seq`` to ``through``
                    "through": Field("int", required=False)},
    "ack": {"actor_id": Field("str"), "applied_seq": Field("int"), "durable_seq": Field("int"),
            "learner_done": Field("bool", required=False)},  # the learner reached its env-step target
    "weights": {"version": Field("int"), "arrays": Field("dict"), "meta": Field("dict", required=False)},
}


def _check(name: str, spec: Field, value: Any) -> None:
    if value is None:
        if spec.nullable:
            return
        raise ProtocolError("schema", f"field {name!r} must not be null")
    k = spec.kind
    if k == "any":
        return
    if k == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif k == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif k == "array":
        ok = isinstance(value, np.ndarray)
        if ok and spec.ndim is not None and value.ndim != spec.ndim:
            raise ProtocolError("schema", f"field {name!r} must be a {spec.ndim}-d array, got shape "
                                f"{value.shape}")
        if ok and spec.dtype == "float" and value.dtype.kind != "f":
            raise ProtocolError("schema", f"field {name!r} must be a float array, got {value.dtype}")
    else:
        ok = isinstance(value, _PY[k])
    if not ok:
        raise ProtocolError("schema", f"field {name!r} must be {k}, got {type(value).__name__}")


_ALLOWED = {kind: frozenset(schema) for kind, schema in SCHEMAS.items()}
# per kind, field -> the exact types that pass without ``_check`` (a bool is not an int here;
# arrays, nulls and subclasses take the full check): one lookup per field on every request
_EXACT = {"int": (int,), "float": (float, int), "str": (str,), "bytes": (bytes,), "dict": (dict,), "list": (list,),
          "bool": (bool,)}
_FAST = {kind: {name: _EXACT.get(spec.kind, ()) for name, spec in schema.items()} for kind, schema in SCHEMAS.items()}
_REQUIRED = {kind: tuple(name for name, spec in schema.items() if spec.required) for kind, schema in SCHEMAS.items()}


def validate(kind: str, fields: dict[str, Any]) -> None:
    """Raise ProtocolError unless ``fields`` fit ``SCHEMAS[kind]`` (unknown fields refused)."""
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise ProtocolError("unknown_kind", f"unknown message kind {kind!r}; known: {sorted(SCHEMAS)}")
    if not _ALLOWED[kind].issuperset(fields):
        extra = set(fields) - _ALLOWED[kind]
        raise ProtocolError("schema", f"{kind}: unknown field(s) {sorted(extra)}; allowed: {sorted(schema)}")
    for name in _REQUIRED[kind]:
        if name not in fields:
            raise ProtocolError("schema", f"{kind}: missing field {name!r}")
    fast = _FAST[kind]
    for name, value in fields.items():  # only the fields present: a request carries few of the optional ones
        if type(value) not in fast[name]:
            _check(name, schema[name], value)


# -- messages --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Message:
    kind: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


def encode(kind: str, check: bool = True, **fields: Any) -> bytes:
    """One message frame. ``check`` validates against the schema first (the sender's bug is
    caught at the sender)."""
    if check:
        validate(kind, fields)
    return msgpack.packb({"v": PROTOCOL_VERSION, "kind": kind, **fields}, default=_default,
                         use_bin_type=True)


def encode_frames(kind: str, **fields: Any) -> list:
    """Like ``encode``, but arrays of >= OUT_OF_BAND_BYTES travel as their own frames, so
    their bytes are never copied into the msgpack body: [body, data frames...]. ZeroMQ copies
    each frame once on send (``copy=True`` measured faster on loopback than pyzmq's zero-copy
    send, whose buffer release goes through a helper thread)."""
    validate(kind, fields)
    buffers: list = []

    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and obj.nbytes >= OUT_OF_BAND_BYTES:
            arr, name = _sendable(obj)  # copied only when it must be
            buffers.append(memoryview(arr).cast("B"))
            return msgpack.ExtType(NDARRAY_FRAME_EXT, _packed_header((name, arr.shape, len(buffers) - 1)))
        return _default(obj)

    body = msgpack.packb({"v": PROTOCOL_VERSION, "kind": kind, **fields}, default=default, use_bin_type=True)
    return [body, *buffers]


def decode(frame, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and check one message -> Message; every failure is a ProtocolError.

    ``frame``: one frame (bytes-like), or a list of frames [body, data frames...] as made by
    ``encode_frames``; every data frame must be referenced exactly once."""
    frames = list(frame) if isinstance(frame, (list, tuple)) else [frame]
    if not frames:
        raise ProtocolError("malformed", "empty message")
    size = sum(map(len, frames))
    if size > max_bytes:
        raise ProtocolError("too_large", f"message of {size} bytes exceeds the limit of {max_bytes}")
    body, buffers, used = frames[0], frames[1:], set()
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=partial(_ext_hook, buffers, used),
                              use_list=True)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise ProtocolError("malformed", f"not a msgpack message: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("malformed", f"message must be a map, got {type(obj).__name__}")
    version = obj.pop("v", None)
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {version!r} not supported; this side speaks "
                            f"{PROTOCOL_VERSION} (upgrade the older side)")
    kind = obj.pop("kind", None)
    if not isinstance(kind, str):
        raise ProtocolError("malformed", "message has no 'kind' string")
    if len(used) != len(buffers):
        raise ProtocolError("malformed", f"{len(buffers) - len(used)} data frame(s) not referenced by the message")
    try:
        validate(kind, obj)
    except ProtocolError as exc:
        rid = obj.get("request_id")
        if isinstance(rid, int) and not isinstance(rid, bool):
            exc.request_id = rid
        raise
    return Message(kind, obj)


def error_frame(exc: ProtocolError | str, message: str = "", request_id: int | None = None) -> bytes:
    """An ``error`` reply for a ProtocolError (or a code + message)."""
    if isinstance(exc, ProtocolError):
        code, message = exc.code, exc.detail
        request_id = exc.request_id if request_id is None else request_id
    else:
        code = exc
    return encode("error", code=code, message=message[:2000], request_id=request_id)
