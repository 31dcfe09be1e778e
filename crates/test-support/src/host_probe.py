# The attacker's code: from inside a sandbox, every way to the host it can think of. TARGETS
# (the host's addresses, which the test read on the host side, with ports to try) and PORTS are
# prepended by the test; the sandbox adds what it finds itself: its routes' gateways and the
# host side (.1) of every network it is on (/proc/net/route: no `ip` needed). Each TCP target
# is "REACHED" when a connection opens, else the error; UDP datagrams are sent to every
# address (only the host's listener can tell whether one arrived). The positive control: a
# listener the probe opens on its own loopback, knocked on the same way ("own"). Prints one
# JSON line.
import json, os, socket

def found_addresses():
    found = []
    try:
        lines = open("/proc/net/route").read().splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        f = line.split()
        if len(f) < 8:
            continue
        gateway, dest, mask = int(f[2], 16), int(f[1], 16), int(f[7], 16)
        if gateway:
            found.append(socket.inet_ntoa(gateway.to_bytes(4, "little")))
        if mask and f[0] != "lo":
            found.append(socket.inet_ntoa(((dest & mask) | (1 << 24)).to_bytes(4, "little")))
    return found

def knock(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "REACHED"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
    finally:
        s.close()

def send_udp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.sendto(b"probe", (host, port))
        return "sent"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
    finally:
        s.close()

own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
interfaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
gateways = found_addresses()
hosts = list(dict.fromkeys(TARGETS + gateways))
tcp = {f"{h}:{p}": knock(h, p) for h in hosts for p in PORTS}
tcp.update({f"{h}:{p}": knock(h, p) for h, p in EXTRA})
udp = {f"{h}:{UDP_PORT}": send_udp(h, UDP_PORT) for h in hosts}
result = {"interfaces": interfaces, "gateways": gateways, "tcp": tcp, "udp": udp}
result["own"] = knock("127.0.0.1", own.getsockname()[1])
print(json.dumps(result))
