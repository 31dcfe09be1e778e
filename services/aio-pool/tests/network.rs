//! Tier `aio` reaches nothing on the host: hostile code, run the way a user runs it (an
//! execution of tier `aio` through the scheduler), knocks on every host address it is told
//! (read by the test on the host side) or finds (its routes), on its own loopback and at
//! another session's instance, while listeners of the test's own wait on the host's
//! `0.0.0.0` (TCP and UDP) and `127.0.0.1`. The same probe reaches a listener of its own and
//! the instance's agent on its loopback, and, from a container on a normal Docker bridge, the
//! host's listener: so it would have seen a way to the host if there were one.

use messages::browser::AioAcquire;
use messages::exec::{ExecStatus, TierChoice};
use test_support::hostnet::{self, HostListeners, ProbeReport};

use crate::common::{image, Harness};
use crate::tier::{exec, front, python};

#[tokio::test]
async fn code_in_tier_aio_reaches_nothing_on_the_host() {
    let listeners = HostListeners::start();
    let host = hostnet::host_addresses();
    let h = Harness::start(&[]).await;
    let stop = front(&h, "strict", true).await;
    // Another session's instance: its control socket, a path on the host, is its only way in.
    let other = h
        .aio
        .acquire(&AioAcquire {
            session_id: "other".into(),
            browser: false,
        })
        .await
        .unwrap();
    let other_socket = other
        .base_url
        .trim_start_matches("http+unix://")
        .trim_end_matches('/')
        .replace("%2F", "/");

    let agent = "127.0.0.1:8080";
    let extra = [
        ("127.0.0.1", listeners.any),
        ("127.0.0.1", listeners.loopback),
        // The instance's own agent, on its own loopback: reached.
        ("127.0.0.1", 8080),
    ];
    let code = hostnet::python_probe(
        &host,
        &[listeners.any, listeners.loopback],
        &extra,
        listeners.udp,
    ) + &format!(
        "s = socket.socket(socket.AF_UNIX)\n\
         try:\n    s.connect({other_socket:?})\n    print('OTHER INSTANCE REACHED')\n\
         except OSError as e:\n    print('other instance:', type(e).__name__)\n\
         print(sorted(os.listdir('/run/sandmesh-aio')))\n\
         for d in ['/tmp', '/run/sandmesh-aio']:\n\
         \x20   try:\n        open(d + '/filler', 'w').write('x')\n        print(d, 'written')\n\
         \x20   except OSError as e:\n        print(d, type(e).__name__)\n"
    );
    let r = exec(&h, &python(Some("attacker"), TierChoice::Aio, &code)).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let seen = ProbeReport::parse(&r.stdout);
    // The probe sees a connection when there is one.
    assert_eq!(seen.own, "REACHED", "{seen:#?}");
    assert_eq!(seen.tcp[agent], "REACHED", "{seen:#?}");
    // No interface but loopback: no gateway to find, nothing of the host to reach.
    assert_eq!(seen.interfaces, ["lo"], "{seen:#?}");
    assert_eq!(
        seen.reached_except(&[agent]),
        Vec::<&str>::new(),
        "{seen:#?}"
    );
    let rest: Vec<&str> = r.stdout.lines().skip(1).collect();
    // Its control directory holds its own socket only, and takes nothing more (a file
    // there would be on the host's disk); /tmp, its own, does.
    assert_eq!(
        rest,
        [
            "other instance: FileNotFoundError",
            "['agent.sock']",
            "/tmp written",
            "/run/sandmesh-aio PermissionError"
        ],
        "{r:?}"
    );
    assert_eq!(
        listeners.seen(),
        vec![],
        "the host's listeners were reached"
    );

    // The positive control outside: the same probe from a container on Docker's default
    // bridge reaches the host's listener on 0.0.0.0 through that bridge's gateway.
    let gateway = hostnet::default_bridge_gateway();
    let control = hostnet::python_probe(&[gateway], &[listeners.any], &[], listeners.udp);
    let out = hostnet::run_on_default_bridge(image(), "10001", "python3", &["-c", &control]);
    let seen = ProbeReport::parse(&out);
    let target = format!("{gateway}:{}", listeners.any);
    assert_eq!(seen.reached_except(&[]), [target.as_str()], "{seen:#?}");
    let listeners = &listeners;
    test_support::eventually_true(
        "the host's listener saw the control's connection",
        std::time::Duration::from_secs(10),
        || async move {
            listeners
                .seen()
                .iter()
                .any(|(which, _)| *which == "tcp 0.0.0.0")
        },
    )
    .await;
    stop.cancel();
    h.stop().await;
}
