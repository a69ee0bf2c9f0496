//! A model's endpoints from its URLs: each as it is, or, with `dns_refresh`, each
//! name resolved to all its addresses and re-resolved on that period (a Kubernetes
//! headless Service lists one address per ready pod).
//!
//! A resolved endpoint keeps its URL (so TLS and the `Host` header still name the
//! service) with its own client pinned to one address; its label, what the metrics
//! and documents name, is the URL with that address in place of the name. A lookup
//! that fails keeps the endpoints it had, and a name that never resolved is used as it
//! is (the probe then reports it unreachable), so the gateway starts either way.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use reqwest::Url;
use tracing::Instrument;

use super::{Endpoint, Fleet};
use crate::engine::upstream::fault::strip_credentials;

/// What every endpoint's connections are made with.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    pub connect_timeout: Duration,
}

impl Connections {
    fn client(self, pinned: Option<(&str, SocketAddr)>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60));
        if let Some((host, addr)) = pinned {
            builder = builder.resolve(host, addr);
        }
        builder.build().unwrap_or_default()
    }
}

/// The endpoint of `url` as written.
pub fn fixed(url: &str, connections: Connections) -> Arc<Endpoint> {
    Arc::new(Endpoint::new(
        url.to_owned(),
        strip_credentials(url),
        connections.client(None),
    ))
}

/// The endpoints of `url` whose host resolved to `addrs`: one per address.
pub fn resolved(url: &str, addrs: &[SocketAddr], connections: Connections) -> Vec<Arc<Endpoint>> {
    let Ok(parsed) = Url::parse(url) else {
        return vec![fixed(url, connections)];
    };
    let Some(host) = parsed.host_str() else {
        return vec![fixed(url, connections)];
    };
    let mut addrs = addrs.to_vec();
    addrs.sort();
    addrs.dedup();
    addrs
        .iter()
        .map(|addr| {
            let mut labelled = parsed.clone();
            let shown = match addr.ip() {
                IpAddr::V4(ip) => ip.to_string(),
                IpAddr::V6(ip) => format!("[{ip}]"),
            };
            let _ = labelled.set_host(Some(&shown));
            let label = strip_credentials(labelled.as_str().trim_end_matches('/'));
            Arc::new(Endpoint::new(
                url.to_owned(),
                label,
                connections.client(Some((host, *addr))),
            ))
        })
        .collect()
}

/// Whether `url`'s host is a name to resolve (not an address already).
pub fn is_name(url: &str) -> bool {
    Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().is_err())
        })
        .unwrap_or(false)
}

async fn lookup(url: &str) -> std::io::Result<Vec<SocketAddr>> {
    let parsed = Url::parse(url).map_err(std::io::Error::other)?;
    let host = parsed
        .host_str()
        .ok_or_else(|| std::io::Error::other("no host"))?
        .to_owned();
    let port = parsed.port_or_known_default().unwrap_or(80);
    Ok(tokio::net::lookup_host((host, port)).await?.collect())
}

/// The endpoints of all `urls` now: names resolved when `dns` is on; `previous`
/// stands in for a URL whose lookup failed.
async fn endpoints_of(
    urls: &[String],
    dns: bool,
    connections: Connections,
    previous: &[Arc<Endpoint>],
) -> Vec<Arc<Endpoint>> {
    let mut all = Vec::new();
    for url in urls {
        if !dns || !is_name(url) {
            all.push(fixed(url, connections));
            continue;
        }
        match lookup(url).await {
            Ok(addrs) if !addrs.is_empty() => all.extend(resolved(url, &addrs, connections)),
            outcome => {
                let kept: Vec<_> = previous.iter().filter(|e| &e.url == url).cloned().collect();
                tracing::warn!(
                    url = %strip_credentials(url),
                    error = %outcome.err().map_or_else(|| "no addresses".to_owned(), |e| e.to_string()),
                    kept = kept.len(),
                    "Could not resolve an upstream's name; keeping the endpoints it had."
                );
                if kept.is_empty() {
                    all.push(fixed(url, connections));
                } else {
                    all.extend(kept);
                }
            }
        }
    }
    all
}

/// The fleet of `urls`, each as written until its name is resolved: with
/// `dns_refresh`, in the background at once and then on that period, while the fleet
/// lives (the gateway does not wait for a resolver to start). With `engine_metrics`,
/// the endpoints' metrics are scraped in the background too.
pub fn start(
    urls: Vec<String>,
    config: super::FleetConfig,
    connections: Connections,
) -> Arc<Fleet> {
    let refresh = config.dns_refresh;
    let scraped = config.policy == super::Policy::EngineMetrics;
    let first = urls.iter().map(|url| fixed(url, connections)).collect();
    let fleet = Arc::new(Fleet::new(config, first));
    if let Some(every) = refresh {
        tokio::spawn(
            re_resolve(Arc::downgrade(&fleet), urls, every, connections).in_current_span(),
        );
    }
    if scraped {
        tokio::spawn(super::scrape::run(Arc::downgrade(&fleet)).in_current_span());
    }
    fleet
}

async fn re_resolve(
    fleet: Weak<Fleet>,
    urls: Vec<String>,
    every: Duration,
    connections: Connections,
) {
    loop {
        let Some(this) = fleet.upgrade() else {
            return;
        };
        let fresh = endpoints_of(&urls, true, connections, &this.endpoints()).await;
        this.replace(fresh);
        drop(this);
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONNECTIONS: Connections = Connections {
        connect_timeout: Duration::from_secs(1),
    };

    #[test]
    fn a_name_gives_one_endpoint_per_address_labelled_by_address() {
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.2:8000".parse().unwrap(),
            "10.0.0.1:8000".parse().unwrap(),
            "[fd00::1]:8000".parse().unwrap(),
            "10.0.0.1:8000".parse().unwrap(),
        ];
        let endpoints = resolved("http://user:pw@vllm.ns.svc:8000/v1", &addrs, CONNECTIONS);
        let labels: Vec<_> = endpoints.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "http://10.0.0.1:8000/v1",
                "http://10.0.0.2:8000/v1",
                "http://[fd00::1]:8000/v1"
            ]
        );
        assert!(endpoints
            .iter()
            .all(|e| e.url == "http://user:pw@vllm.ns.svc:8000/v1"));
    }

    #[test]
    fn addresses_are_not_names() {
        assert!(is_name("http://vllm:8000/v1"));
        assert!(!is_name("http://10.1.2.3:8000/v1"));
        assert!(!is_name("http://[::1]:8000/v1"));
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_kept_as_written() {
        let url = "http://no-such-host.invalid:8000/v1".to_owned();
        let endpoints = endpoints_of(std::slice::from_ref(&url), true, CONNECTIONS, &[]).await;
        assert_eq!(endpoints.len(), 1);
        assert_eq!(endpoints[0].label, url);
        // With endpoints from an earlier lookup, those stay.
        let earlier = resolved(&url, &["10.0.0.7:8000".parse().unwrap()], CONNECTIONS);
        let kept = endpoints_of(std::slice::from_ref(&url), true, CONNECTIONS, &earlier).await;
        assert!(Arc::ptr_eq(&kept[0], &earlier[0]));
    }

    #[tokio::test]
    async fn localhost_resolves_to_its_loopback_addresses() {
        let url = "http://localhost:9/v1".to_owned();
        let endpoints = endpoints_of(std::slice::from_ref(&url), true, CONNECTIONS, &[]).await;
        assert!(!endpoints.is_empty());
        assert!(endpoints
            .iter()
            .all(|e| e.label == "http://127.0.0.1:9/v1" || e.label == "http://[::1]:9/v1"));
    }
}
