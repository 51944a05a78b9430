"""The Open Inference Protocol's JSON tensors as `kiln.serve`'s worker reads and writes them:
a request's inputs decoded into numpy arrays (nested lists without numpy), checked against their
datatype and shape, and outputs encoded with the datatype and shape they hold."""

from __future__ import annotations

import json
import math
from types import ModuleType
from typing import Any, NoReturn, Optional

# Datatype -> (numpy dtype, inclusive int range or None).
_DATATYPES: dict[str, tuple[str, Optional[tuple[int, int]]]] = {
    "BOOL": ("bool", None),
    "UINT8": ("uint8", (0, (1 << 8) - 1)),
    "UINT16": ("uint16", (0, (1 << 16) - 1)),
    "UINT32": ("uint32", (0, (1 << 32) - 1)),
    "UINT64": ("uint64", (0, (1 << 64) - 1)),
    "INT8": ("int8", (-(1 << 7), (1 << 7) - 1)),
    "INT16": ("int16", (-(1 << 15), (1 << 15) - 1)),
    "INT32": ("int32", (-(1 << 31), (1 << 31) - 1)),
    "INT64": ("int64", (-(1 << 63), (1 << 63) - 1)),
    "FP16": ("float16", None),
    "FP32": ("float32", None),
    "FP64": ("float64", None),
    "BYTES": ("object", None),
}
# numpy is optional: the functions below take the module, or None without it, and its arrays pass
# through them as Any (the worker works on nested lists too). JSON values are Any as well.
_Numpy = Optional[ModuleType]

class _Refused(Exception):
    """A request kiln cannot answer: its HTTP status and a message naming the problem."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _numpy() -> _Numpy:
    """The numpy module, or None when it is not importable."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


# === requests ===


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# Built once: json.loads and json.dumps with options build a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def decode_request(body: bytes, np: _Numpy) -> tuple[dict[str, Any], list[str] | None, str | None]:
    """(inputs by name, requested output names or None, id) from an infer body; a bad body
    raises `_Refused` (400) naming the tensor."""
    try:
        request = _DECODER.decode(body.decode())
    except (ValueError, RecursionError) as error:
        raise _Refused(400, f"the body is not JSON: {error}") from None
    if not isinstance(request, dict):
        raise _Refused(400, "the body must be a JSON object")
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise _Refused(400, "the request's id must be a string")
    tensors = request.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise _Refused(400, "the request has no inputs")
    inputs: dict[str, Any] = {}
    for at, tensor in enumerate(tensors):
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if not isinstance(name, str):
            raise _Refused(400, f"input {at} has no name")
        if name in inputs:
            raise _Refused(400, f"input {name!r} is given twice")
        inputs[name] = _input_value(f"input {name!r}", tensor, np)
    wanted = request.get("outputs")
    if wanted is None:
        return inputs, None, request_id
    if not isinstance(wanted, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted):
        raise _Refused(400, "the request's outputs must be a list of {\"name\": ...}")
    return inputs, [output["name"] for output in wanted], request_id


def _input_value(what: str, tensor: dict[str, Any], np: _Numpy) -> Any:
    """One input tensor as a numpy array (or nested list without numpy), checked against its
    datatype and shape."""
    datatype, shape, data = tensor.get("datatype"), tensor.get("shape"), tensor.get("data")
    if datatype not in _DATATYPES:
        raise _Refused(400, f"{what}: unknown datatype {datatype!r}; known are {', '.join(_DATATYPES)}")
    if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
        raise _Refused(400, f"{what}: shape must be a list of non-negative integers, not {shape!r}")
    if not isinstance(data, list):
        raise _Refused(400, f"{what}: data must be a list")
    count = math.prod(shape)
    if np is not None and datatype != "BYTES":
        return _input_array(what, datatype, shape, count, data, np)
    flat = _flatten(data, [])
    if len(flat) != count:
        raise _Refused(400, f"{what}: shape {shape} holds {count} elements but the data has {len(flat)}")
    values = _checked(what, datatype, flat)
    if np is None:
        return _nest(values, shape)
    array = np.empty(count, dtype=object)
    array[:] = values
    return array.reshape(shape)


def _input_array(what: str, datatype: str, shape: list[int], count: int, data: list[Any], np: ModuleType) -> Any:
    try:
        array = np.array(data)
    except ValueError:  # nested unevenly: take the leaves in order
        array = np.array(_flatten(data, []))
    if array.size != count:
        raise _Refused(400, f"{what}: shape {shape} holds {count} elements but the data has {array.size}")
    dtype, int_range = _DATATYPES[datatype]
    kind = array.dtype.kind
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    if kind == "O":  # ints beyond 64 bits, or a mixture: check them one by one
        return np.array(_checked(what, datatype, array.ravel().tolist()), dtype=dtype).reshape(shape)
    wanted = {"BOOL": "b"}.get(datatype, "iu" if int_range else "iuf")
    if kind not in wanted:
        raise _Refused(400, f"{what}: the data are not {datatype} values")
    if int_range and (int(array.min()) < int_range[0] or int(array.max()) > int_range[1]):
        raise _Refused(400, f"{what}: values outside {datatype}")
    return array.astype(dtype, copy=False).reshape(shape)


def _flatten(data: list[Any], into: list[Any]) -> list[Any]:
    """The leaves of nested lists in row-major order."""
    for item in data:
        if isinstance(item, list):
            _flatten(item, into)
        else:
            into.append(item)
    return into


def _checked(what: str, datatype: str, flat: list[Any]) -> list[Any]:
    """The JSON values as Python values of `datatype` (BYTES as bytes); raises `_Refused`
    naming the first element that is not one."""
    int_range = _DATATYPES[datatype][1]
    for at, value in enumerate(flat):
        if datatype == "BOOL":
            fits = type(value) is bool
        elif datatype == "BYTES":
            fits = type(value) is str
        elif int_range:
            fits = type(value) is int and int_range[0] <= value <= int_range[1]
        else:
            fits = type(value) in (int, float)
        if not fits:
            raise _Refused(400, f"{what}: element {at} ({value!r}) is not a {datatype} value")
    if datatype == "BYTES":
        return [value.encode() for value in flat]
    return flat


def _nest(flat: list[Any], shape: list[int]) -> Any:
    """Row-major `flat` as nested lists of `shape` (a scalar for shape [])."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[row * step:(row + 1) * step], shape[1:]) for row in range(shape[0])]


# === responses ===


def encode_output(name: str, value: Any, np: _Numpy) -> dict[str, Any]:
    """One of predict_fn's outputs as an OIP tensor; what JSON cannot carry raises `_Refused` (500)."""
    what = f"output {name!r}"
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        shape, kind, bits = list(array.shape), array.dtype.kind, array.dtype.itemsize * 8
        if kind == "b":
            datatype = "BOOL"
        elif kind in "iu" and bits <= 64:
            datatype = f"{'U' if kind == 'u' else ''}INT{bits}"
        elif kind == "f" and bits in (16, 32, 64):
            if not np.isfinite(array).all():
                raise _Refused(500, f"{what} holds NaN or infinity, which JSON cannot carry")
            datatype = f"FP{bits}"
        elif kind in "SUO":
            datatype, data = _inferred(what, array.ravel().tolist(), np)
            return {"name": name, "datatype": datatype, "shape": shape, "data": data}
        else:
            raise _Refused(500, f"{what} has dtype {array.dtype}, which OIP cannot carry")
        return {"name": name, "datatype": datatype, "shape": shape, "data": array.ravel().tolist()}
    shape = _dims(value)
    flat: list[Any] = []
    _flatten_shaped(what, value, shape, 0, flat)
    datatype, data = _inferred(what, flat, np)
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def _dims(value: Any) -> list[int]:
    """The shape of nested lists, read along their first elements."""
    dims: list[int] = []
    while isinstance(value, (list, tuple)):
        dims.append(len(value))
        if not value:
            break
        value = value[0]
    return dims


def _flatten_shaped(what: str, value: Any, dims: list[int], depth: int, into: list[Any]) -> None:
    if depth == len(dims):
        if isinstance(value, (list, tuple)):
            raise _Refused(500, f"{what} is ragged: its nested lists do not all have the shape {dims}")
        into.append(value)
        return
    if not isinstance(value, (list, tuple)) or len(value) != dims[depth]:
        raise _Refused(500, f"{what} is ragged: its nested lists do not all have the shape {dims}")
    for item in value:
        _flatten_shaped(what, item, dims, depth + 1, into)


def _inferred(what: str, flat: list[Any], np: _Numpy) -> tuple[str, list[Any]]:
    """(datatype, JSON data) of Python values: all bool BOOL, all int INT64, any float FP64,
    str or bytes BYTES (as UTF-8 text)."""
    if np is not None:
        flat = [value.item() if isinstance(value, np.generic) else value for value in flat]
    types = {type(value) for value in flat}
    if types and types <= {bool}:
        return "BOOL", flat
    if types and types <= {bool, int}:
        if not all(-(1 << 63) <= value < (1 << 63) for value in flat):
            raise _Refused(500, f"{what} holds an integer beyond INT64")
        return "INT64", [int(value) for value in flat]
    if types <= {bool, int, float}:
        if not all(math.isfinite(value) for value in flat):
            raise _Refused(500, f"{what} holds NaN or infinity, which JSON cannot carry")
        return "FP64", [float(value) for value in flat]
    if types <= {str, bytes}:
        try:
            return "BYTES", [value.decode() if type(value) is bytes else value for value in flat]
        except UnicodeDecodeError:
            raise _Refused(500, f"{what} holds bytes that are not UTF-8, which JSON cannot carry") from None
    names = ", ".join(sorted(t.__name__ for t in types))
    raise _Refused(500, f"{what} holds {names}; outputs are numbers, bools, str or bytes (or arrays of them)")


# === the server ===
