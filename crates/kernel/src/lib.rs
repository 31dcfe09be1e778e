//! The kernel drivers and their protocol, one definition for both hosts that run them: the
//! sandbox's resident supervisor (session kernels) and the AIO agent (`/v1/jupyter/*`).
//!
//! A driver is a long-lived interpreter whose cells share one namespace: stdlib Python
//! (`kernel.py`, run as `python3 -c`) and plain Node (`kernel.js`, run as `node -e`), no
//! ipykernel (not in the images, hundreds of milliseconds to start, a five-socket protocol).
//! The host writes one JSON request per cell to the driver's stdin and reads [`Event`] lines
//! from its event pipe; `kernel.py`'s header documents both. Passing the source on the command
//! line leaves no file a cell could replace between restarts.
//!
//! Nothing a driver says is trusted by its host: lines are bounded, unknown events dropped,
//! artifact paths checked where they are used.

use sandbox_protocol::{CellError, RichOutput};
use serde::Deserialize;

/// The Python driver's source (`python3 -c`).
pub const PYTHON_DRIVER: &str = include_str!("kernel.py");

/// The JavaScript driver's source (`node -e`). Node cannot re-point its own fds, so its host
/// moves the event pipe off fd 1, makes fds 1 and 2 pipes whose non-blocking read ends the
/// driver drains, and names the three in `SANDMESH_KERNEL_FDS` (`events,stdout,stderr`).
pub const JAVASCRIPT_DRIVER: &str = include_str!("kernel.js");

/// The variable through which the JavaScript driver learns its fds.
pub const KERNEL_FDS_VAR: &str = "SANDMESH_KERNEL_FDS";

/// One event line from a driver (`kernel.py`'s header), or the fence its host writes into the
/// event pipe itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Event {
    /// Text the cell printed (`name` is `stdout` or `stderr`).
    Stream { name: String, text: String },
    /// One representation of a result or a display; an object's representations arrive one
    /// after another.
    Output(RichOutput),
    /// The exception the cell raised.
    Error(CellError),
    /// The cell ended; `id` is the request's.
    Done {
        #[serde(default)]
        id: Option<String>,
    },
    /// Never the driver's: the line the supervisor writes into the event pipe once a frozen
    /// kernel's last output is in it, so it knows where a cell's output ends.
    Fence { id: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::OutputKind;

    #[test]
    fn every_event_the_drivers_write_is_read() {
        let lines = [
            r#"{"t": "stream", "name": "stdout", "text": "42\n"}"#,
            r#"{"t": "output", "kind": "result", "mime_type": "image/png", "content": "iVBO", "base64": true}"#,
            r#"{"t": "output", "kind": "display", "mime_type": "text/html", "path": "out/1.html"}"#,
            r#"{"t": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": ["x"]}"#,
            r#"{"t": "done", "id": "c1"}"#,
            r#"{"t": "done"}"#,
        ];
        let events: Vec<Event> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert!(
            matches!(&events[0], Event::Stream { name, text } if name == "stdout" && text == "42\n")
        );
        assert!(matches!(&events[1], Event::Output(o) if o.kind == OutputKind::Result && o.base64));
        assert!(matches!(&events[2], Event::Output(o) if o.path.as_deref() == Some("out/1.html")));
        assert!(matches!(&events[3], Event::Error(e) if e.traceback == ["x"]));
        assert_eq!(
            events[4],
            Event::Done {
                id: Some("c1".into())
            }
        );
        assert_eq!(events[5], Event::Done { id: None });
    }

    #[test]
    fn an_unknown_or_malformed_event_is_refused() {
        for line in [
            r#"{"t": "exec", "code": "rm -rf /"}"#,
            r#"{"t": "output", "kind": "evil", "mime_type": "text/plain"}"#,
            r#"{"t": "stream", "name": "stdout"}"#,
            r#"{"text": "no tag"}"#,
        ] {
            assert!(serde_json::from_str::<Event>(line).is_err(), "{line}");
        }
    }

    #[test]
    fn the_drivers_speak_the_documented_events() {
        for t in ["stream", "output", "error", "done"] {
            assert!(
                PYTHON_DRIVER.contains(&format!("\"t\": \"{t}\"")),
                "kernel.py writes {t}"
            );
            assert!(
                JAVASCRIPT_DRIVER.contains(&format!("t: '{t}'")),
                "kernel.js writes {t}"
            );
        }
        assert!(JAVASCRIPT_DRIVER.contains(KERNEL_FDS_VAR));
    }
}
