//! What a sandbox must not reach on the host: listeners of the test's own on every address
//! (`0.0.0.0`, TCP and UDP) and on loopback (`127.0.0.1`), which count who came, and the
//! host's own non-loopback addresses, read from the host side (`ip -o addr`), so the hostile
//! code can be told where to knock. Every test of "the sandbox reaches nothing on the host"
//! uses these, from inside the sandbox kind it concerns.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Hostile Python for a sandbox that has python3: [`python_probe`] fills in its targets.
const PYTHON_PROBE: &str = include_str!("host_probe.py");

/// The probe's code: TCP to every one of `hosts` × `ports` and to the `extra` pairs, UDP to
/// every host on `udp`, plus what the sandbox finds itself (its routes' gateways). Its one
/// line of output is [`ProbeReport`]'s JSON.
pub fn python_probe(hosts: &[IpAddr], ports: &[u16], extra: &[(&str, u16)], udp: u16) -> String {
    let hosts: Vec<String> = hosts.iter().map(IpAddr::to_string).collect();
    format!(
        "TARGETS = {}\nPORTS = {}\nEXTRA = {}\nUDP_PORT = {udp}\n{PYTHON_PROBE}",
        serde_json::to_string(&hosts).expect("strings encode"),
        serde_json::to_string(ports).expect("ports encode"),
        serde_json::to_string(extra).expect("pairs encode"),
    )
}

/// What [`python_probe`] saw.
#[derive(Debug, serde::Deserialize)]
pub struct ProbeReport {
    /// The sandbox's network interfaces.
    pub interfaces: Vec<String>,
    /// The gateways (and networks' host sides) its routes named.
    pub gateways: Vec<String>,
    /// `host:port` → `REACHED` or the error.
    pub tcp: std::collections::BTreeMap<String, String>,
    /// The probe's own loopback listener: `REACHED` shows it sees a connection when there is
    /// one.
    pub own: String,
}

impl ProbeReport {
    /// The probe's one line of `stdout`.
    pub fn parse(stdout: &str) -> Self {
        serde_json::from_str(stdout.lines().next().unwrap_or_default())
            .unwrap_or_else(|e| panic!("the probe printed {stdout:?}: {e}"))
    }

    /// The TCP targets reached, but `allowed`.
    pub fn reached_except(&self, allowed: &[&str]) -> Vec<&str> {
        self.tcp
            .iter()
            .filter(|(t, r)| *r == "REACHED" && !allowed.contains(&t.as_str()))
            .map(|(t, _)| t.as_str())
            .collect()
    }
}

/// The line the TCP listeners greet every connection with: a probe that reads it reached
/// the host.
pub const GREETING: &str = "HOST-LISTENER";

/// Listeners on the host: `any` (TCP on `0.0.0.0`), `loopback` (TCP on `127.0.0.1`) and
/// `udp` (UDP on `0.0.0.0`). Each records the peers that reached it. They run on threads of
/// their own, so a connection is recorded even while the test blocks (on `docker exec`, say).
pub struct HostListeners {
    pub any: u16,
    pub loopback: u16,
    pub udp: u16,
    seen: Seen,
    stop: Arc<AtomicBool>,
}

type Seen = Arc<Mutex<Vec<(&'static str, SocketAddr)>>>;

impl Drop for HostListeners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl HostListeners {
    pub fn start() -> Self {
        let seen = Seen::default();
        let stop = Arc::new(AtomicBool::new(false));
        let any = TcpListener::bind("0.0.0.0:0").expect("bind 0.0.0.0");
        let loopback = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let udp = UdpSocket::bind("0.0.0.0:0").expect("bind UDP 0.0.0.0");
        let ports = (
            any.local_addr().unwrap().port(),
            loopback.local_addr().unwrap().port(),
            udp.local_addr().unwrap().port(),
        );
        for (which, listener) in [("tcp 0.0.0.0", any), ("tcp 127.0.0.1", loopback)] {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || greet(which, listener, &seen, &stop));
        }
        let (seen_udp, stop_udp) = (seen.clone(), stop.clone());
        std::thread::spawn(move || record_datagrams(udp, &seen_udp, &stop_udp));
        Self {
            any: ports.0,
            loopback: ports.1,
            udp: ports.2,
            seen,
            stop,
        }
    }

    /// Who reached which listener so far (`("tcp 0.0.0.0", peer)`, …).
    pub fn seen(&self) -> Vec<(&'static str, SocketAddr)> {
        self.seen.lock().unwrap().clone()
    }
}

/// How often the listeners look at their stop flag.
const POLL: Duration = Duration::from_millis(20);

fn greet(which: &'static str, listener: TcpListener, seen: &Seen, stop: &AtomicBool) {
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                seen.lock().unwrap().push((which, peer));
                let _ = stream.write_all(format!("{GREETING}\n").as_bytes());
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn record_datagrams(socket: UdpSocket, seen: &Seen, stop: &AtomicBool) {
    socket.set_read_timeout(Some(POLL)).expect("a read timeout");
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, peer)) = socket.recv_from(&mut buf) {
            seen.lock().unwrap().push(("udp 0.0.0.0", peer));
        }
    }
}

/// The host's addresses other than loopback and IPv6 link-local (which needs an interface to
/// be named): its LAN addresses and every Docker bridge's gateway on the host.
pub fn host_addresses() -> Vec<IpAddr> {
    let out = Command::new("ip")
        .args(["-o", "addr", "show"])
        .output()
        .expect("`ip -o addr show` lists the host's addresses (install iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    let addresses: Vec<IpAddr> = text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .filter(|ip: &IpAddr| match ip {
            IpAddr::V4(v4) => !v4.is_loopback(),
            IpAddr::V6(v6) => !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80,
        })
        .collect();
    assert!(
        !addresses.is_empty(),
        "the host has no address but loopback: nothing to probe"
    );
    addresses
}

/// The gateway (the host's address) of Docker's default bridge: where a container on a
/// normal bridge reaches the host, for the probes' positive control. Read from the bridge's
/// interface on the host (Docker does not always record the gateway in the network).
pub fn default_bridge_gateway() -> IpAddr {
    let out = Command::new("docker")
        .args([
            "network",
            "inspect",
            "bridge",
            "--format",
            r#"{{index .Options "com.docker.network.bridge.name"}}"#,
        ])
        .output()
        .expect("docker network inspect bridge");
    let interface = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show", "dev", &interface])
        .output()
        .expect("ip -o -4 addr show");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("Docker's default bridge ({interface:?}) has no IPv4 address"))
}

/// Runs `args` in a throwaway container of `image` on Docker's default bridge (a normal one,
/// with the host's gateway), as `user`, with `entrypoint`; its stdout. The positive control
/// of a probe: from there, a listener on the host's `0.0.0.0` is reachable, so a probe that
/// sees nothing from a sandbox would have seen it.
pub fn run_on_default_bridge(image: &str, user: &str, entrypoint: &str, args: &[&str]) -> String {
    let mut cmd = Command::new("docker");
    cmd.args([
        "run",
        "--rm",
        "--network",
        "bridge",
        "--user",
        user,
        "--entrypoint",
        entrypoint,
    ]);
    if let Ok(run) = std::env::var("SANDMESH_TEST_RUN") {
        cmd.args(["--label", &format!("sandmesh.test-run={run}")]);
    }
    let out = cmd
        .arg(image)
        .args(args)
        .output()
        .expect("docker run on the default bridge");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
