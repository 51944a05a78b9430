#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target under fuzz/corpus/<target>/ (small files: valid
inputs and the attacks each parser must refuse). Run it again after changing a seed; the files
are committed, so the fuzzers start from them on a clean machine.

    python3 fuzz/make_corpus.py
"""

import gzip
import io
import json
import pathlib
import struct
import tarfile

corpus = pathlib.Path(__file__).resolve().parent / "corpus"


def write(target, name, data):
    directory = corpus / target
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)


# --- archives ----------------------------------------------------------------------------------


def tar_of(entries, fmt=tarfile.GNU_FORMAT):
    """entries: (name, type, linkname, data, pax headers)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, kind, link, data, pax in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            info.mode = 0o644
            info.mtime = 0
            if pax:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    # Without the padding to a 10 KiB record: the end is two zero blocks, as tar readers need.
    blocks = out.getvalue()
    end = len(blocks)
    while end >= 512 and blocks[end - 512 : end] == bytes(512):
        end -= 512
    return blocks[:end] + bytes(1024)


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


def entry(name, kind=tarfile.REGTYPE, link="", data=b"", pax=None):
    return (name, kind, link, data, pax)


archives = {
    "valid": tar_of([
        entry("src/", tarfile.DIRTYPE),
        entry("src/train.py", data=b"print('hi')\n"),
        entry("latest", tarfile.SYMTYPE, "src/train.py"),
        entry("src/up", tarfile.SYMTYPE, "../src"),
        entry("copy.py", tarfile.LNKTYPE, "src/train.py"),
    ]),
    "traversal": tar_of([entry("../escape.txt", data=b"x")]),
    "absolute": tar_of([entry("/etc/kiln-escape", data=b"x")]),
    "symlink_out": tar_of([entry("evil", tarfile.SYMTYPE, "../../etc")]),
    "through_symlink": tar_of([entry("dir", tarfile.SYMTYPE, "sub"), entry("dir/file", data=b"x")]),
    "hardlink_to_symlink": tar_of([
        entry("a/b/up", tarfile.SYMTYPE, "../secret"),
        entry("up", tarfile.LNKTYPE, "a/b/up"),
    ]),
    "device": tar_of([entry("dev", tarfile.CHRTYPE), entry("fifo", tarfile.FIFOTYPE)]),
    "valid_long_name": tar_of([entry("d" * 150 + "/" + "f" * 150, data=b"x")]),
    "valid_pax": tar_of([entry("p" * 120, data=b"x", pax={"path": "pax/" + "n" * 200, "size": "1"})], tarfile.PAX_FORMAT),
    "many_entries": tar_of([entry(f"f{i}") for i in range(300)]),
    # A GNU long name of 2 MiB (the header limit is 1 MiB), a few KiB compressed.
    "long_name_bomb": tar_of([entry("n" * (2 << 20), data=b"x")]),
}
# A bomb: 8 MiB of zeros in one entry, about 8 KiB compressed; the fuzz limit is 1 MiB.
bomb = tar_of([entry("big", data=bytes((8 << 20) - 1) + b"\x01")])

for name, tar in archives.items():
    # archive_unpack: a first byte of 0 has the harness gzip the rest, 1 takes it as gzipped.
    if len(tar) < 64 << 10:
        write("archive_unpack", f"{name}.tar", b"\x00" + tar)
    else:
        write("archive_unpack", f"{name}.tar.gz", b"\x01" + gz(tar))
    write("archive_check", f"{name}.tar.gz", gz(tar))
write("archive_unpack", "valid.tar.gz", b"\x01" + gz(archives["valid"]))
write("archive_unpack", "bomb.tar.gz", b"\x01" + gz(bomb))
write("archive_check", "bomb.tar.gz", gz(bomb))
write("archive_check", "truncated.tar.gz", gz(archives["valid"])[:-12])

# --- batch templates (one argument per line) ---------------------------------------------------

templates = {
    "valid": "sh\n-c\ncp {uri} {output}/x.{item} && echo {{{attempt}}}",
    "noop": "kiln:noop",
    "sleep": "kiln:sleep\n250",
    "unknown_placeholder": "echo\n{url}",
    "unclosed": "echo\n{uri",
    "stray": "echo\na}b",
    "unknown_builtin": "kiln:teleport",
    "empty": "",
    "nul": "echo\na\x00b",
}
for name, text in templates.items():
    write("batch_template", name, text.encode())

# --- metric batches (protobuf MetricBatch) -----------------------------------------------------


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire, payload):
    tag = varint(number << 3 | wire)
    if wire == 2:
        return tag + varint(len(payload)) + payload
    return tag + payload


def columns(keys, key_index, steps, values, timestamps=()):
    out = b"".join(field(1, 2, k.encode()) for k in keys)
    out += field(2, 2, b"".join(varint(i) for i in key_index))
    out += field(3, 2, b"".join(varint(s) for s in steps))
    out += field(4, 2, b"".join(struct.pack("<d", v) for v in values))
    if timestamps:
        out += field(5, 2, b"".join(varint(t) for t in timestamps))
    return out


def point(key, step, value, ts=0):
    return field(1, 2, key.encode()) + field(2, 0, varint(step)) + field(3, 1, struct.pack("<d", value)) + field(4, 0, varint(ts))


def batch(cols=None, points=()):
    out = field(1, 2, b"job-1") + field(2, 0, varint(1))
    out += b"".join(field(3, 2, p) for p in points)
    if cols is not None:
        out += field(4, 2, cols)
    return out


nan, inf = float("nan"), float("inf")
metric_batches = {
    "valid": batch(columns(["loss", "acc"], [0, 1, 0], [1, 1, 2], [0.5, 0.9, 0.4], [10, 10, 20])),
    "points_and_columns": batch(columns(["loss"], [0, 0], [1, 2], [nan, inf]), [point("lr", 1, 0.1)]),
    "extreme_steps": batch(columns(["s"], [0, 0], [-(1 << 63), (1 << 63) - 1], [1.0, -inf])),
    "short_values": batch(columns(["loss"], [0, 0], [1, 2], [0.5])),
    "bad_key_index": batch(columns(["loss"], [0, 7], [1, 2], [0.5, 0.6])),
    "bad_timestamps": batch(columns(["loss"], [0], [1], [0.5], [1, 2])),
    "empty": b"",
}
for name, data in metric_batches.items():
    write("metric_columns", name, data)


# --- oip_request: an inference request body; an odd first byte means the first two bytes
# (little-endian, shifted right by one) are the JSON header's length, as
# Inference-Header-Content-Length gives it ------------------------------------------------------
def with_header(header, tail):
    head = json.dumps(header).encode()
    return struct.pack("<H", (len(head) << 1) | 1) + head + tail


oip_requests = {
    "json": json.dumps({
        "id": "1",
        "inputs": [
            {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1.5, 2], [3, 4]]},
            {"name": "s", "shape": [1], "datatype": "BYTES", "data": ["hi"]},
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode(),
    "binary": with_header(
        {"inputs": [
            {"name": "x", "shape": [2], "datatype": "INT16", "parameters": {"binary_data_size": 4}},
            {"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}},
        ]},
        struct.pack("<hh", -2, 7) + struct.pack("<I", 2) + b"ok",
    ),
    "shape_mismatch": json.dumps(
        {"inputs": [{"name": "x", "shape": [3], "datatype": "BOOL", "data": [True]}]}).encode(),
    "huge_shape": json.dumps(
        {"inputs": [{"name": "x", "shape": [1 << 32, 1 << 32], "datatype": "FP64", "data": []}]}).encode(),
}
for name, data in oip_requests.items():
    write("oip_request", name, data)
