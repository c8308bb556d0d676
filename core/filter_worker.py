"""The process that evaluates MessageContent filters (``python -m wsnmom.core.filter_worker
MEMORY_MB``), started and spoken to by :mod:`wsnmom.core.filter_sandbox`.

It reads requests from stdin and writes verdicts to stdout until stdin ends.

Request (parent to worker): a 4-byte big-endian length, then that many bytes of a pickled
tuple ``(text, namespaces, exslt_regex, cpu_limit, payloads)``: the expression, its
prefix bindings as ``((prefix, uri), ...)``, whether the EXSLT regular-expression
functions are available, the CPU seconds one payload may take, and the serialised payload
elements.

Verdicts (worker to parent), one per payload, written as soon as it is known:
``b"1"`` (matches), ``b"0"`` (does not), or ``b"E"`` + a 2-byte big-endian length + that
many bytes of UTF-8 (the expression cannot be evaluated: the text says why), or ``b"M"``
(memory exhausted; the worker exits after writing it).  After the last verdict of a request:
``b"T"`` + an 8-byte big-endian double, the CPU seconds the worker spent on the request
(what the parent charges the subscription: wall time on a loaded machine would make a cheap
filter look costly).

Bounds: the address space of the process is limited to ``MEMORY_MB`` MiB (``RLIMIT_AS``),
and each payload's parse and evaluation runs under a CPU-time timer (``ITIMER_PROF``)
whose signal is left at its default action, so the kernel ends the process when one
evaluation overruns -- whatever the evaluation is doing, with or without the GIL.  The
parent sees the end of the stream and knows which payload did it.
"""

from __future__ import annotations

import pickle
import resource
import signal
import struct
import sys
import time
from collections import OrderedDict
from typing import Any, BinaryIO

from lxml import etree
from wsnmom.core.safe_xml import hardened_parser

#: compiled expressions kept (by text, bindings and regex flag)
CACHE_SIZE = 1024
#: libxml2's error type of a failed allocation (the address-space limit was reached)
_NO_MEMORY = etree.ErrorTypes.ERR_NO_MEMORY


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def xpath_boolean(result: object) -> bool:
    """XPath 1.0 ``boolean()`` of an lxml XPath result."""
    if isinstance(result, bool):
        return result
    if isinstance(result, float | int):
        return result != 0 and result == result  # NaN is false
    if isinstance(result, str | bytes | list):
        return len(result) > 0
    return bool(result)


def _error(text: str) -> bytes:
    data = text.encode("utf-8", "replace")[:60000]
    return b"E" + struct.pack("!H", len(data)) + data


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests until ``inp`` ends."""
    parser = hardened_parser(collect_ids=False)
    cache: OrderedDict[tuple[object, ...], etree.XPath | str] = OrderedDict()
    while True:
        header = _read_exact(inp, 4)
        if header is None:
            return
        (length,) = struct.unpack("!I", header)
        body = _read_exact(inp, length)
        if body is None:
            return
        started = time.process_time()
        text, namespaces, exslt_regex, cpu_limit, payloads = pickle.loads(body)
        key = (text, namespaces, exslt_regex)
        xpath = cache.get(key)
        if xpath is None:
            try:
                xpath = etree.XPath(
                    text, namespaces=dict(namespaces), regexp=exslt_regex, smart_strings=False
                )
            except etree.XPathError as exc:
                xpath = str(exc) or type(exc).__name__
            cache[key] = xpath
            while len(cache) > CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        for payload in payloads:
            if isinstance(xpath, str):
                out.write(_error(xpath))
                out.flush()
                continue
            signal.setitimer(signal.ITIMER_PROF, cpu_limit)
            try:
                verdict = b"1" if xpath_boolean(xpath(etree.fromstring(payload, parser))) else b"0"
            except MemoryError:
                signal.setitimer(signal.ITIMER_PROF, 0)
                out.write(b"M")
                out.flush()
                return
            except (etree.XPathError, etree.XMLSyntaxError) as exc:
                # the evaluator's error log (lxml-stubs do not know it) says what failed
                log: Any = getattr(
                    exc if isinstance(exc, etree.XMLSyntaxError) else xpath, "error_log", ()
                )
                if any(entry.type == _NO_MEMORY for entry in log):
                    signal.setitimer(signal.ITIMER_PROF, 0)
                    out.write(b"M")
                    out.flush()
                    return
                verdict = _error(str(exc) or type(exc).__name__)
            except Exception as exc:  # an extension function's error (re:test with a bad pattern)
                verdict = _error(f"{type(exc).__name__}: {exc}")
            signal.setitimer(signal.ITIMER_PROF, 0)
            out.write(verdict)
            out.flush()
        out.write(b"T" + struct.pack("!d", time.process_time() - started))
        out.flush()


def main(argv: list[str]) -> None:
    """Entry point: ``MEMORY_MB`` as the only argument (0 = no memory limit)."""
    memory_mb = int(argv[1]) if len(argv) > 1 else 0
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main(sys.argv)
