//! Where a browser may navigate. The egress proxy enforces the policy on every connection
//! Chromium makes (sub-resources and redirects included); this check runs the same rules on the
//! navigation target first so that a refused URL gets a clear error instead of a proxy error
//! page: `http`/`https` only, then the egress rules on the host and port, then every address
//! the host resolves to.

use std::net::IpAddr;

use egress::{EgressRules, Refusal, Resolver, Target};

#[derive(Debug, thiserror::Error)]
pub enum NavigationRefused {
    #[error("not a URL: {0}")]
    Invalid(#[source] url::ParseError),
    #[error("only http and https navigation is allowed; {0}: URLs are refused")]
    Scheme(String),
    #[error("the URL has no host")]
    NoHost,
    #[error("{host}:{port} refused by the session's network policy: {refusal}")]
    Policy {
        host: String,
        port: u16,
        #[source]
        refusal: Refusal,
    },
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
}

/// Checks `raw` and returns it parsed.
pub async fn check(
    rules: &EgressRules,
    resolver: &dyn Resolver,
    raw: &str,
) -> Result<url::Url, NavigationRefused> {
    let url = url::Url::parse(raw.trim()).map_err(NavigationRefused::Invalid)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(NavigationRefused::Scheme(url.scheme().to_string()));
    }
    let host = url.host_str().ok_or(NavigationRefused::NoHost)?.to_string();
    let port = url.port_or_known_default().unwrap_or(80);
    let refused = |refusal| NavigationRefused::Policy {
        host: host.clone(),
        port,
        refusal,
    };
    match rules.check_target(&host, port).map_err(refused)? {
        Target::Address { .. } => Ok(url),
        Target::Name { host: name, .. } => {
            let answers: Vec<IpAddr> =
                resolver
                    .resolve(&name)
                    .await
                    .map_err(|source| NavigationRefused::Resolve {
                        host: name.clone(),
                        source,
                    })?;
            // As the proxy does: an answer it may dial is enough; otherwise the first refusal.
            let mut first = None;
            for ip in answers {
                match rules.check_resolved(ip) {
                    Ok(_) => return Ok(url),
                    Err(r) => {
                        first.get_or_insert(r);
                    }
                }
            }
            Err(match first {
                Some(r) => refused(r),
                None => NavigationRefused::Resolve {
                    host: name,
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, "no addresses"),
                },
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress::{NetworkPolicy, StaticResolver};

    fn public() -> EgressRules {
        EgressRules::new(&NetworkPolicy {
            allow_all: true,
            ..Default::default()
        })
        .unwrap()
    }

    async fn refusal(url: &str) -> String {
        let resolver = StaticResolver::new()
            .with("example.com", &["93.184.215.14".parse().unwrap()])
            .with("localhost", &["127.0.0.1".parse().unwrap()])
            .with("rebind.test", &["10.0.0.5".parse().unwrap()]);
        check(&public(), &resolver, url)
            .await
            .map(|u| u.to_string())
            .unwrap_err()
            .to_string()
    }

    #[tokio::test]
    async fn only_http_and_https_pass() {
        for (url, scheme) in [
            ("file:///etc/passwd", "file"),
            ("chrome://settings", "chrome"),
            ("devtools://devtools/bundled/inspector.html", "devtools"),
            ("data:text/html,<h1>x</h1>", "data"),
            ("javascript:alert(1)", "javascript"),
            ("ftp://example.com/", "ftp"),
        ] {
            let e = refusal(url).await;
            assert!(
                e.contains(&format!("{scheme}: URLs are refused")),
                "{url}: {e}"
            );
        }
        let resolver =
            StaticResolver::new().with("example.com", &["93.184.215.14".parse().unwrap()]);
        assert!(check(&public(), &resolver, "https://example.com/x")
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn internal_targets_are_refused_by_name_and_by_address() {
        assert!(refusal("http://localhost:8080/")
            .await
            .contains("port 8080"));
        assert!(refusal("http://localhost/")
            .await
            .contains("resolves to 127.0.0.1"));
        assert!(refusal("http://rebind.test/")
            .await
            .contains("resolves to 10.0.0.5"));
        assert!(refusal("http://169.254.169.254/latest/meta-data/")
            .await
            .contains("169.254.169.254"));
        assert!(refusal("http://[::1]/").await.contains("::1"));
        assert!(refusal("not a url").await.contains("not a URL"));
    }

    #[tokio::test]
    async fn an_allowed_cidr_lets_loopback_through() {
        let rules = EgressRules::new(&NetworkPolicy {
            allow_cidrs: vec!["127.0.0.2/32".into()],
            ports: Some(vec![8080]),
            ..Default::default()
        })
        .unwrap();
        let resolver = StaticResolver::new();
        assert!(check(&rules, &resolver, "http://127.0.0.2:8080/")
            .await
            .is_ok());
        let e = check(&rules, &resolver, "http://127.0.0.1:8080/")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
    }
}
