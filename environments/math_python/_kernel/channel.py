"""The pipes between host, supervisor and executor: frames, waiting, descriptor hygiene.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON, at most
:data:`MAX_FRAME` bytes. Waiting uses ``poll``, which takes descriptors above
``FD_SETSIZE``. :func:`close_all_but` bounds what a process can reach: after it, only
the descriptors it was meant to have (the executor has none of the host's).
"""

import json
import os
import select
import struct

#: the largest frame read from a pipe, in bytes
MAX_FRAME = 64 << 20


def close_all_but(keep):
    """Close every descriptor of this process except ``keep`` (inherited ones included)."""
    low = 3
    for fd in sorted(fd for fd in keep if fd >= 3):
        if fd > low:  # closerange(a, b) with b < a would close everything from a up
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def clean(text, limit=None):
    """``text`` as a str that encodes to UTF-8 (lone surrogates escaped), at most ``limit`` chars."""
    if not isinstance(text, str):
        return None
    if limit is not None and len(text) > limit:
        text = f"[... {len(text) - limit} characters omitted ...]\n" + text[-limit:]
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def read_frame(fd):
    """The next frame on blocking ``fd``, decoded; EOFError at end of file, ValueError
    for a frame over :data:`MAX_FRAME` bytes."""
    (n,) = struct.unpack(">I", _read_exact(fd, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    return json.loads(_read_exact(fd, n).decode())


def encode_frame(obj):
    """``obj`` as frame bytes (length prefix included)."""
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def write_frame(fd, obj):
    """Write ``obj`` as one frame to blocking ``fd``, all of it."""
    data = encode_frame(obj)
    while data:
        data = data[os.write(fd, data):]


def ready(readers, writers, timeout):
    """``(readable, writable)`` among the given descriptors (ints or objects with
    ``fileno()``, returned as given) within ``timeout`` seconds: ``poll``, which, unlike
    ``select``, takes descriptors above ``FD_SETSIZE`` (1024)."""
    def num(f):
        return f if isinstance(f, int) else f.fileno()

    want = {}
    for f in readers:
        want[num(f)] = want.get(num(f), 0) | select.POLLIN | select.POLLPRI
    for f in writers:
        want[num(f)] = want.get(num(f), 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in want.items():
        poller.register(fd, mask)
    events = dict(poller.poll(timeout * 1000.0))
    gone = select.POLLHUP | select.POLLERR
    r = [f for f in readers if events.get(num(f), 0) & (select.POLLIN | select.POLLPRI | gone)]
    w = [f for f in writers if events.get(num(f), 0) & (select.POLLOUT | gone)]
    return r, w
