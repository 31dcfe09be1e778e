# sandmesh's Python kernel driver: a long-lived interpreter whose cells share one namespace.
#
# Started by the container's resident supervisor (`sandmesh-supervisor kernel`) or the AIO
# agent, embedded in their binaries (the `sandmesh-kernel` crate). Why not ipykernel: it is not in the sandbox image, it starts in hundreds of
# milliseconds (zmq, tornado, IPython), and it speaks a five-socket protocol the supervisor
# would have to implement. This driver is stdlib only and speaks JSON lines over two pipes:
#
#   fd 0 (supervisor -> kernel): {"id": ..., "code": ..., "workspace": ..., "inline_max": N}
#   fd 1 (kernel -> supervisor): {"t": "stream", "name": "stdout"|"stderr", "text": "..."}
#                                {"t": "output", "kind": "result"|"display", "mime_type": ...,
#                                 "content"?: ..., "base64"?: true, "path"?: ...}
#                                {"t": "error", "name": ..., "value": ..., "traceback": [...]}
#                                {"t": "done", "id": ...}   (the request's id)
#
# The cell's own fds 0-2 are replaced (stdin /dev/null, stdout and stderr pipes pumped into
# stream events), so a subprocess's output is captured too and nothing a cell prints can
# break the framing; sys.stdout and sys.stderr send their text as events directly. The supervisor trusts none of this: it bounds every line and size.
# SIGINT interrupts a running cell (KeyboardInterrupt) and is ignored between cells.

import ast
import base64
import builtins
import codecs
import io
import json
import os
import select
import signal
import sys
import threading
import traceback

os.environ["MPLBACKEND"] = "Agg"

_proto_in = os.fdopen(os.dup(0), "rb")
_proto_out = os.dup(1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_pipes = {}
for _fd, _name in ((1, "stdout"), (2, "stderr")):
    _r, _w = os.pipe()
    os.dup2(_w, _fd)
    os.close(_w)
    _pipes[_r] = (_name, codecs.getincrementaldecoder("utf-8")("replace"))
sys.stdin = open(0, "r", closefd=False)

# Held while output is read and sent, so events keep the order the output was written in.
_io_lock = threading.RLock()
_in_cell = False
# The main thread is writing an event: an interrupt now would cut a line in half, so it is
# deferred to the end of the write.
_sending = False
_interrupt_pending = False
_CHUNK = 16384


def _send(event):
    global _sending, _interrupt_pending
    line = (json.dumps(event, ensure_ascii=True) + "\n").encode()
    main = threading.current_thread() is threading.main_thread()
    with _io_lock:
        if main:
            _sending = True
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(_proto_out, view):]
        finally:
            if main:
                _sending = False
    if main and _interrupt_pending:
        _interrupt_pending = False
        if _in_cell:
            raise KeyboardInterrupt


def _drain_pipes():
    """Forwards everything the output pipes hold now (fd-level output: children, C code)."""
    with _io_lock:
        while True:
            ready, _, _ = select.select(list(_pipes), [], [], 0)
            if not ready:
                return
            for fd in ready:
                name, decoder = _pipes[fd]
                text = decoder.decode(os.read(fd, 65536))
                if text:
                    _send({"t": "stream", "name": name, "text": text})


class _Stream(io.TextIOBase):
    """sys.stdout / sys.stderr: text goes out as events at once, after any fd-level output
    written before it, so nothing printed is lost if the kernel dies right after."""

    def __init__(self, name, fd):
        self._name = name
        self._fd = fd

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def fileno(self):
        return self._fd

    def write(self, text):
        text = str(text)
        with _io_lock:
            _drain_pipes()
            for at in range(0, len(text), _CHUNK):
                _send({"t": "stream", "name": self._name, "text": text[at:at + _CHUNK]})
        return len(text)


sys.stdout = _Stream("stdout", 1)
sys.stderr = _Stream("stderr", 2)


def _pump():
    # Output written at the fd level while a cell runs (a child's, a C library's) streams
    # as it comes.
    while True:
        ready, _, _ = select.select(list(_pipes), [], [], 1.0)
        if ready:
            _drain_pipes()


threading.Thread(target=_pump, daemon=True).start()


def _flush_output():
    _drain_pipes()


_MIME = (
    ("text/html", "_repr_html_"),
    ("image/png", "_repr_png_"),
    ("application/json", "_repr_json_"),
)
_EXT = {"text/plain": "txt", "text/html": "html", "image/png": "png", "application/json": "json"}


class _Cell:
    workspace = "/workspace"
    inline_max = 131072


def _bundle(obj):
    """The object's representations, as Jupyter's display machinery would find them."""
    data = {}
    mimebundle = getattr(obj, "_repr_mimebundle_", None)
    if callable(mimebundle):
        try:
            got = mimebundle()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                data.update({k: v for k, v in got.items() if k in _EXT})
        except Exception:
            pass
    for mime, method in _MIME:
        fn = getattr(obj, method, None)
        if mime in data or not callable(fn) or isinstance(obj, type):
            continue
        try:
            value = fn()
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is not None:
            data[mime] = value
    data.setdefault("text/plain", repr(obj))
    return data


def _emit(kind, mime, value):
    if mime == "image/png":
        if isinstance(value, str):
            raw = base64.b64decode(value)
        else:
            raw = bytes(value)
        encoded, is_b64 = base64.b64encode(raw).decode(), True
    elif mime == "application/json":
        raw = (value if isinstance(value, str) else json.dumps(value)).encode()
        encoded, is_b64 = raw.decode(), False
    else:
        raw = str(value).encode("utf-8", "backslashreplace")
        encoded, is_b64 = raw.decode(), False
    event = {"t": "output", "kind": kind, "mime_type": mime}
    if len(encoded) > _Cell.inline_max:
        rel = "artifacts/output-%s.%s" % (os.urandom(6).hex(), _EXT[mime])
        os.makedirs(os.path.join(_Cell.workspace, "artifacts"), exist_ok=True)
        with open(os.path.join(_Cell.workspace, rel), "wb") as f:
            f.write(raw)
        event["path"] = rel
    else:
        event["content"] = encoded
        if is_b64:
            event["base64"] = True
    _send(event)


def _publish(obj, kind):
    _flush_output()
    for mime, value in _bundle(obj).items():
        try:
            _emit(kind, mime, value)
        except Exception as e:
            print("display: %s could not be shown: %r" % (mime, e), file=sys.stderr)


def display(*objs):
    """Shows each object as a rich output (Jupyter's `display`)."""
    for obj in objs:
        _publish(obj, "display")


builtins.display = display


def _capture_figures():
    """Every open matplotlib figure becomes an image/png output, then is closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png", bbox_inches="tight")
        _flush_output()
        _emit("display", "image/png", buf.getvalue())
    plt.close("all")


_namespace = {"__name__": "__main__", "__builtins__": builtins, "display": display}


def _on_sigint(signum, frame):
    global _interrupt_pending
    if not _in_cell:
        return  # between cells: nothing to interrupt
    if _sending:
        _interrupt_pending = True
        return
    raise KeyboardInterrupt

_FLAGS = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
_loop = None


def _run(code_obj):
    global _loop
    result = eval(code_obj, _namespace)
    if code_obj.co_flags & 0x80:  # CO_COROUTINE: the cell awaited at top level
        if _loop is None:
            import asyncio
            _loop = asyncio.new_event_loop()
        result = _loop.run_until_complete(result)
    return result


def _cell_frames(tb):
    """The traceback from the cell's first frame on (the driver's own frames are noise)."""
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next
    return tb


def _execute(code):
    global _in_cell
    # Each cell gets the interrupt back, whatever an earlier cell did with SIGINT.
    signal.signal(signal.SIGINT, _on_sigint)
    _in_cell = True
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        _run(compile(tree, "<cell>", "exec", _FLAGS))
        if last is not None:
            value = _run(compile(last, "<cell>", "eval", _FLAGS))
            if value is not None:
                _namespace["_"] = value
                _publish(value, "result")
        _capture_figures()
        return None
    except BaseException as e:  # KeyboardInterrupt and SystemExit end the cell, not us
        tb = _cell_frames(e.__traceback__) if not isinstance(e, SyntaxError) else None
        report = traceback.TracebackException(type(e), e, tb)
        # The driver's own frames (the SIGINT handler's, a display call's) are noise.
        report.stack = traceback.StackSummary.from_list(
            [f for f in report.stack if f.filename != "<string>"])
        lines = list(report.format())
        return {"t": "error", "name": type(e).__name__, "value": str(e), "traceback": lines}
    finally:
        _in_cell = False


def main():
    while True:
        line = _proto_in.readline()
        if not line:
            return
        cell_id = None
        try:
            request = json.loads(line)
            cell_id = request.get("id")
            _Cell.workspace = request.get("workspace", _Cell.workspace)
            _Cell.inline_max = int(request.get("inline_max", _Cell.inline_max))
            code = request["code"]
        except Exception as e:
            error = {"t": "error", "name": "ProtocolError", "value": repr(e), "traceback": []}
        else:
            error = _execute(code)
        if error is not None:
            try:
                sys.stderr.write("".join(error["traceback"]))
            except Exception:
                pass
        _flush_output()
        if error is not None:
            _send(error)
        _send({"t": "done", "id": cell_id})


main()
