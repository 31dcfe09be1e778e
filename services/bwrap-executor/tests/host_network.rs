//! A bubblewrap sandbox reaches nothing on the host: hostile code knocks on every host address
//! the test read on the host side (its LAN addresses, every Docker bridge's gateway), on
//! whatever its routes name and on its own loopback, over TCP and UDP, while listeners of the
//! test's own wait on the host's `0.0.0.0` and `127.0.0.1`. The same probe reaches a listener
//! it opens on its own loopback, so it would have seen a connection.

use crate::common::{BwrapRuns, Harness};
use messages::exec::{ExecStatus, Language};
use test_support::hostnet::{self, HostListeners, ProbeReport};

#[tokio::test]
async fn a_bwrap_sandbox_reaches_nothing_on_the_host() {
    let listeners = HostListeners::start();
    let h = Harness::start().await;
    let code = hostnet::python_probe(
        &hostnet::host_addresses(),
        &[listeners.any, listeners.loopback],
        &[
            ("127.0.0.1", listeners.any),
            ("127.0.0.1", listeners.loopback),
        ],
        listeners.udp,
    );
    let r = h.exec(Language::Python, &code).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let seen = ProbeReport::parse(&r.stdout);
    assert_eq!(
        seen.own, "REACHED",
        "the probe sees a connection: {seen:#?}"
    );
    assert_eq!(seen.interfaces, ["lo"], "{seen:#?}");
    assert_eq!(seen.reached_except(&[]), Vec::<&str>::new(), "{seen:#?}");
    assert_eq!(
        listeners.seen(),
        vec![],
        "the host's listeners were reached"
    );
    h.assert_recovered().await;
    h.stop().await;
}
