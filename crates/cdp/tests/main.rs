//! sandmesh-cdp's integration tests: the framing and error paths against a real WebSocket
//! server started in the test, and the page actions against a real headless Chromium.

mod chromium;
mod socket;
