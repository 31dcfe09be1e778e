//! `sandmesh console`: where the operators' web page is and how to log in. It opens nothing:
//! the page is on loopback and the person at this machine decides when to use it.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::creds;

/// The console's address as `up` configures it (`SANDMESH_CONSOLE_ADDR`, else the default).
fn addr(env: &HashMap<String, String>) -> String {
    env.get("SANDMESH_CONSOLE_ADDR")
        .filter(|a| !a.trim().is_empty())
        .cloned()
        .unwrap_or_else(|| ::console::config::DEFAULT_ADDR.to_string())
}

/// The page's URL for these settings.
pub fn url(env: &HashMap<String, String>) -> String {
    format!("http://{}/", addr(env))
}

/// Whether the console's address can be listened on now (`up` runs without the console
/// otherwise, saying why). A malformed address passes: the console's configuration reports
/// it with every other bad setting.
pub fn can_listen(env: &HashMap<String, String>) -> Result<(), String> {
    let addr = addr(env);
    let Ok(parsed) = addr.parse::<SocketAddr>() else {
        return Ok(());
    };
    std::net::TcpListener::bind(parsed)
        .map(drop)
        .map_err(|e| format!("cannot listen on {addr} ({e}); set SANDMESH_CONSOLE_ADDR"))
}

pub fn run() -> anyhow::Result<i32> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let url = url(&env);
    println!("The operators' console: {url}");
    let running = addr(&env)
        .parse::<SocketAddr>()
        .ok()
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok());
    if !running {
        println!("  (nothing answers there now: `sandmesh up` starts it)");
    }
    let file = creds::creds_dir(&creds::data_dir()).join("operator.json");
    match creds::CredsFile::load(&file) {
        Ok(c) => {
            println!("Log in as:  {}", c.user);
            println!(
                "Password:   the \"password\" of {} (readable by you only), also shown by \
                 `sandmesh creds --as operator`",
                file.display()
            );
        }
        Err(_) => println!(
            "Log in with an operator's NATS credentials (user `operator` of `sandmesh up`; \
             `sandmesh creds --as operator` shows them)."
        ),
    }
    println!(
        "Operators with a named set of tenants log in with their own user and see only those."
    );
    Ok(0)
}
