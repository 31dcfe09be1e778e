# Runs inside an AIO instance: finds the instance's browser through the agent
# (/json/version on 127.0.0.1, no key needed from inside) and speaks CDP over its WebSocket
# relay with nothing but the standard library: Browser.getVersion, then a page evaluating
# 6*7. Prints one JSON line.
import base64, json, os, socket, struct, urllib.request

AGENT = "127.0.0.1:8080"

def ws_connect(url):
    assert url.startswith("ws://"), url
    host, path = url[5:].split("/", 1)
    h, p = host.split(":")
    s = socket.create_connection((h, int(p)), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return s

def ws_send(s, obj):
    data = json.dumps(obj).encode()
    mask = os.urandom(4)
    n = len(data)
    hdr = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf

def ws_recv(s):
    b1, b2 = recv_exact(s, 2)
    n = b2 & 0x7F
    if n == 126:
        n = struct.unpack(">H", recv_exact(s, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", recv_exact(s, 8))[0]
    return json.loads(recv_exact(s, n))

def call(s, id_, method, params=None, session=None):
    msg = {"id": id_, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    ws_send(s, msg)
    while True:
        m = ws_recv(s)
        if m.get("id") == id_:
            return m

version = json.load(urllib.request.urlopen(f"http://{AGENT}/json/version", timeout=40))
s = ws_connect(version["webSocketDebuggerUrl"])
product = call(s, 1, "Browser.getVersion")["result"]["product"]
target = call(s, 2, "Target.createTarget", {"url": "about:blank"})["result"]["targetId"]
session = call(s, 3, "Target.attachToTarget", {"targetId": target, "flatten": True})["result"]["sessionId"]
value = call(s, 4, "Runtime.evaluate", {"expression": "6*7"}, session)["result"]["result"]["value"]
print(json.dumps({"product": product, "value": value}))
