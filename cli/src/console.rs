//! `sandmesh console`: where the operators' web page is and how to log in. It opens nothing:
//! the page is on loopback and the person at this machine decides when to use it.

use std::collections::HashMap;

use crate::creds;
use crate::face::HttpFace;

pub const FACE: HttpFace = HttpFace {
    var: "SANDMESH_CONSOLE_ADDR",
    default: ::console::config::DEFAULT_ADDR,
};

/// The page's URL for these settings.
pub fn url(env: &HashMap<String, String>) -> String {
    format!("http://{}/", FACE.addr(env))
}

pub fn run() -> anyhow::Result<i32> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let url = url(&env);
    outln!("The operators' console: {url}");
    if !FACE.answers(&env) {
        outln!("  (nothing answers there now: `sandmesh up` starts it)");
    }
    let file = creds::creds_dir(&creds::data_dir()).join("operator.json");
    match creds::CredsFile::load(&file) {
        Ok(c) => {
            outln!("Log in as:  {}", c.user);
            outln!(
                "Password:   the \"password\" of {} (readable by you only), also shown by \
                 `sandmesh creds --as operator`",
                file.display()
            );
        }
        Err(_) => outln!(
            "Log in with an operator's NATS credentials (user `operator` of `sandmesh up`; \
             `sandmesh creds --as operator` shows them)."
        ),
    }
    outln!("Operators with a named set of tenants log in with their own user and see only those.");
    Ok(0)
}
