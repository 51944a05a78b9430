"""`Services.predict`: one request to the predictor's Open Inference Protocol REST API, with
numpy arrays in and out as the protocol's binary tensor extension carries them (exact values,
NaN and infinities too). numpy is imported here, on first use, so the SDK works without it.

The body is the JSON header (its length in `Inference-Header-Content-Length`) followed by each
input's little-endian elements, a BYTES element as its 4-byte little-endian length and its bytes
(kiln_formats::oip). The answer comes the same way (`binary_data_output`); an output the
predictor wrote in JSON is read too.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import tempfile
import urllib.error
import urllib.request
from typing import Any, Mapping

import grpc

from ._errors import KilnError

HEADER_LENGTH = "Inference-Header-Content-Length"

# numpy dtype (kind, itemsize) -> OIP datatype, and back.
_DATATYPES = {
    ("b", 1): "BOOL", ("u", 1): "UINT8", ("u", 2): "UINT16", ("u", 4): "UINT32", ("u", 8): "UINT64",
    ("i", 1): "INT8", ("i", 2): "INT16", ("i", 4): "INT32", ("i", 8): "INT64",
    ("f", 2): "FP16", ("f", 4): "FP32", ("f", 8): "FP64",
}
_DTYPES = {"BOOL": "|b1", "UINT8": "|u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "|i1",
           "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8"}
# The predictor's HTTP statuses (kiln-predictor's Error::http_status) as gRPC codes.
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.FAILED_PRECONDITION, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
          500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def numpy() -> Any:
    try:
        import numpy
    except ImportError as error:
        raise ImportError("kiln: predict needs numpy (pip install numpy)") from error
    return numpy


def _tensor(np: Any, name: str, value: Any) -> tuple[dict[str, Any], bytes]:
    """The header entry and binary part of one input."""
    array = np.asarray(value)
    if array.dtype.kind in "SUO":
        elements = []
        for element in array.reshape(-1):
            if isinstance(element, (str, np.str_)):
                element = element.encode()
            if not isinstance(element, (bytes, np.bytes_)):
                raise TypeError(f"kiln: input {name!r}: a BYTES element is bytes or str, not {type(element).__name__}")
            elements.append(struct.pack("<I", len(element)) + bytes(element))
        data, datatype = b"".join(elements), "BYTES"
    else:
        datatype = _DATATYPES.get((array.dtype.kind, array.dtype.itemsize), "")
        if not datatype:
            raise TypeError(f"kiln: input {name!r} is {array.dtype}; the Open Inference Protocol carries bool, "
                            "integers, float16/32/64 and bytes or str")
        data = array.astype(_DTYPES[datatype], copy=False).tobytes()
    header = {"name": name, "shape": list(array.shape), "datatype": datatype,
              "parameters": {"binary_data_size": len(data)}}
    return header, data


def encode(inputs: Mapping[str, Any], deadline_ms: int | None) -> tuple[bytes, int]:
    """The request's body and its JSON header's length."""
    np = numpy()
    if not inputs:
        raise ValueError("kiln: predict needs at least one input: {name: array}")
    headers, parts = [], []
    for name, value in inputs.items():
        header, data = _tensor(np, name, value)
        headers.append(header)
        parts.append(data)
    parameters: dict[str, Any] = {"binary_data_output": True}
    if deadline_ms is not None:
        if deadline_ms <= 0:
            raise ValueError(f"kiln: deadline_ms must be more than 0, not {deadline_ms}")
        parameters["timeout"] = int(deadline_ms * 1000)  # in microseconds, as Triton reads it
    head = json.dumps({"inputs": headers, "parameters": parameters}).encode()
    return head + b"".join(parts), len(head)


def decode(body: bytes, header_length: int | None) -> dict[str, Any]:
    """The outputs of an answer, by name, as numpy arrays."""
    np = numpy()
    header = json.loads(body[:header_length] if header_length is not None else body)
    binary = memoryview(body)[header_length:] if header_length is not None else memoryview(b"")
    outputs = {}
    at = 0
    for output in header.get("outputs", []):
        datatype, shape = output["datatype"], tuple(output["shape"])
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            data = output.get("data", [])
            if datatype == "BYTES":
                values = [value.encode() if isinstance(value, str) else value for value in data]
                outputs[output["name"]] = np.array(values, dtype=object).reshape(shape)
            else:
                outputs[output["name"]] = np.array(data, dtype=_DTYPES[datatype]).reshape(shape)
            continue
        part = binary[at:at + size]
        at += size
        if datatype == "BYTES":
            elements, offset = [], 0
            while offset < len(part):
                (length,) = struct.unpack_from("<I", part, offset)
                elements.append(bytes(part[offset + 4:offset + 4 + length]))
                offset += 4 + length
            outputs[output["name"]] = np.array(elements, dtype=object).reshape(shape)
        else:
            outputs[output["name"]] = np.frombuffer(part, dtype=_DTYPES[datatype]).reshape(shape).copy()
    return outputs


def _ssl_context() -> ssl.SSLContext:
    """TLS as the SDK's gRPC channels do it: KILN_CA_PEM, KILN_CA_FILE or the credentials file's
    ca-file trusted (else the system roots); a client certificate presented when one is set."""
    from ._run import _pem

    authority = _pem("KILN_CA_PEM", "KILN_CA_FILE", "ca-file")
    context = ssl.create_default_context(cadata=authority.decode() if authority else None)
    cert = _pem("KILN_CLIENT_CERT_PEM", "KILN_CLIENT_CERT", "cert-file")
    key = _pem("KILN_CLIENT_KEY_PEM", "KILN_CLIENT_KEY", "key-file")
    if cert is not None and key is not None:
        # ssl reads a certificate chain from a file only.
        with tempfile.NamedTemporaryFile(suffix=".pem") as pem:
            pem.write(cert + b"\n" + key)
            pem.flush()
            context.load_cert_chain(pem.name)
    return context


def post(url: str, body: bytes, header_length: int, token: str, timeout: float) -> dict[str, Any]:
    """POSTs an inference request; its outputs, or a KilnError with the predictor's status (as
    the gRPC code it stands for) and words."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "authorization": f"Bearer {token}", "content-type": "application/octet-stream",
        HEADER_LENGTH: str(header_length),
    })
    context = _ssl_context() if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            length = answer.headers.get(HEADER_LENGTH)
            return decode(answer.read(), int(length) if length is not None else None)
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            message = json.loads(text).get("error", text)
        except (ValueError, AttributeError):
            message = text or str(error.reason)
        raise KilnError(_CODES.get(error.code, grpc.StatusCode.UNKNOWN), message) from error
    except urllib.error.URLError as error:
        raise KilnError(grpc.StatusCode.UNAVAILABLE, f"cannot reach the predictor at {url}: {error.reason}") from error
    except socket.timeout as error:
        raise KilnError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer from {url} within {timeout} s") from error


__all__ = ["decode", "encode", "numpy", "post"]
