//! An `upstream` model's own keys, checked: its URLs (one server, or the replicas of a
//! fleet), its API key, its timeouts and how its requests are spread over the replicas
//! ([`FleetConfig`]).

use std::ops::RangeInclusive;
use std::time::Duration;

use super::table::ModelTable;
use super::ConfigError;
use crate::engine::upstream::config::UpstreamConfig;
use crate::engine::upstream::fleet::{canary, FleetConfig};
use crate::secret::Secret;

/// Makes the error of one key of a `[[models]]` entry from its message.
pub(super) type Invalid<'a> = &'a dyn Fn(&'static str, String) -> ConfigError;

pub(super) fn upstream(
    t: &ModelTable,
    id: &str,
    invalid: Invalid,
) -> Result<UpstreamConfig, ConfigError> {
    let urls = base_urls(t, invalid)?;
    let mut fleet = fleet(t, invalid)?;
    let api_key = api_key(t, invalid)?;
    let connect_ms = t.connect_timeout_ms.unwrap_or(5000);
    if !(1..=600_000).contains(&connect_ms) {
        return Err(invalid(
            "connect_timeout_ms",
            "must be between 1 and 600000 ms".into(),
        ));
    }
    let max_tokens_param = max_tokens_param(t, invalid)?;
    let model = t.upstream_model.clone().unwrap_or_else(|| id.to_owned());
    if model.trim().is_empty() {
        return Err(invalid("upstream_model", "must not be empty".into()));
    }
    let timeout = |value, default, key| seconds(value, default, key, invalid);
    let first_byte_timeout = timeout(t.first_byte_timeout_secs, 60, "first_byte_timeout_secs")?;
    fleet.failure_takes = first_byte_timeout;
    Ok(UpstreamConfig {
        urls,
        model,
        api_key,
        tokenizer: t.tokenizer.clone(),
        logprobs: t.logprobs.unwrap_or(true),
        connect_timeout: Duration::from_millis(connect_ms),
        first_byte_timeout,
        idle_timeout: timeout(t.idle_timeout_secs, 60, "idle_timeout_secs")?,
        probe_interval: timeout(t.probe_interval_secs, 10, "probe_interval_secs")?,
        context_length: t.context_length.unwrap_or(0),
        check_model: t.check_model.unwrap_or(true),
        max_tokens_param,
        fleet,
    })
}

/// The base URLs of `url` or `urls`, checked, each listed once.
fn base_urls(t: &ModelTable, invalid: Invalid) -> Result<Vec<String>, ConfigError> {
    match (&t.url, &t.urls) {
        (Some(_), Some(_)) => Err(invalid("urls", "set url or urls, not both".into())),
        (Some(url), None) => Ok(vec![base_url(url).map_err(|m| invalid("url", m))?]),
        (None, Some(urls)) if urls.is_empty() => {
            Err(invalid("urls", "must list at least one base URL".into()))
        }
        (None, Some(urls)) => {
            let mut checked = Vec::with_capacity(urls.len());
            for (i, url) in urls.iter().enumerate() {
                let url = base_url(url).map_err(|m| invalid("urls", format!("urls[{i}]: {m}")))?;
                if checked.contains(&url) {
                    return Err(invalid("urls", format!("urls[{i}]: {url} is listed twice")));
                }
                checked.push(url);
            }
            Ok(checked)
        }
        (None, None) => Err(invalid(
            "url",
            "an upstream needs the base URL of its API, such as http://127.0.0.1:8000/v1 (or urls = [...] for several replicas)".into(),
        )),
    }
}

/// The API key from `api_key_file` or `api_key_env`, if either is set.
fn api_key(t: &ModelTable, invalid: Invalid) -> Result<Option<Secret>, ConfigError> {
    match (&t.api_key_file, &t.api_key_env) {
        (Some(_), Some(_)) => Err(invalid(
            "api_key_file",
            "set api_key_file or api_key_env, not both".into(),
        )),
        (Some(path), None) => Ok(Some(Secret::new(
            crate::secret::read_file(path).map_err(|m| invalid("api_key_file", m))?,
        ))),
        (None, Some(variable)) => match std::env::var(variable) {
            Ok(key) if !key.trim().is_empty() => Ok(Some(Secret::new(key.trim()))),
            _ => Err(invalid(
                "api_key_env",
                format!("the environment variable {variable} is not set"),
            )),
        },
        (None, None) => Ok(None),
    }
}

/// The name the upstream's API gives the token limit: `max_tokens` unless set.
fn max_tokens_param(t: &ModelTable, invalid: Invalid) -> Result<String, ConfigError> {
    let param = t
        .max_tokens_param
        .clone()
        .unwrap_or_else(|| "max_tokens".to_owned());
    if !matches!(param.as_str(), "max_tokens" | "max_completion_tokens") {
        return Err(invalid(
            "max_tokens_param",
            format!("'{param}' is not max_tokens or max_completion_tokens"),
        ));
    }
    Ok(param)
}

/// A timeout in seconds, or its default, between 1 s and an hour.
fn seconds(
    value: Option<u64>,
    default: u64,
    key: &'static str,
    invalid: Invalid,
) -> Result<Duration, ConfigError> {
    let secs = value.unwrap_or(default);
    if (1..=3600).contains(&secs) {
        Ok(Duration::from_secs(secs))
    } else {
        Err(invalid(key, "must be between 1 and 3600 seconds".into()))
    }
}

/// A setting, or its default, within `range`.
fn within(
    value: Option<u64>,
    default: u64,
    range: RangeInclusive<u64>,
    key: &'static str,
    invalid: Invalid,
) -> Result<u64, ConfigError> {
    let value = value.unwrap_or(default);
    if range.contains(&value) {
        Ok(value)
    } else {
        let (low, high) = range.into_inner();
        Err(invalid(key, format!("must be between {low} and {high}")))
    }
}

/// How an upstream's requests are spread over its replicas.
fn fleet(t: &ModelTable, invalid: Invalid) -> Result<FleetConfig, ConfigError> {
    let d = FleetConfig::default();
    let load_factor = t.affinity_load_factor.unwrap_or(d.load_factor);
    if !(1.0..=10.0).contains(&load_factor) {
        return Err(invalid(
            "affinity_load_factor",
            "must be between 1 and 10".into(),
        ));
    }
    let metrics_path = t.metrics_path.clone().unwrap_or(d.metrics_path);
    if !metrics_path.starts_with('/') {
        return Err(invalid(
            "metrics_path",
            format!("'{metrics_path}' is not a path (it starts with /)"),
        ));
    }
    let within = |value, default, range, key| within(value, default, range, key, invalid);
    let count = |value: Option<u32>, default: u32, range, key| {
        within(value.map(u64::from), u64::from(default), range, key)
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    };
    let secs = |value, default: Duration, range, key| {
        within(value, default.as_secs(), range, key).map(Duration::from_secs)
    };
    let dns_refresh = t
        .dns_refresh_secs
        .map(|refresh| secs(Some(refresh), Duration::ZERO, 1..=3600, "dns_refresh_secs"))
        .transpose()?;
    let prefix_chars = t.affinity_prefix_chars.map(|c| c as u64);
    let default_chars = d.prefix_chars as u64;
    let canary = match t.canary_interval_secs {
        None if t.canary_prompts.is_some() || t.canary_max_tokens.is_some() => {
            return Err(invalid(
                "canary_interval_secs",
                "the canary's prompts and max_tokens need canary_interval_secs (how often it runs)"
                    .into(),
            ))
        }
        None => None,
        Some(every) => {
            let prompts = t
                .canary_prompts
                .clone()
                .unwrap_or_else(|| canary::DEFAULT_PROMPTS.map(str::to_owned).to_vec());
            if prompts.is_empty() || prompts.iter().any(|p| p.trim().is_empty()) {
                return Err(invalid(
                    "canary_prompts",
                    "list at least one prompt, none of them empty".into(),
                ));
            }
            Some(canary::CanaryConfig {
                every: match every {
                    0.05..=86_400.0 => Duration::from_secs_f64(every),
                    _ => {
                        return Err(invalid(
                            "canary_interval_secs",
                            "must be between 0.05 and 86400 seconds".into(),
                        ))
                    }
                },
                prompts,
                max_tokens: count(t.canary_max_tokens, 16, 1..=512, "canary_max_tokens")?,
            })
        }
    };
    Ok(FleetConfig {
        policy: t.policy.unwrap_or_default(),
        max_attempts: count(t.max_attempts, d.max_attempts, 1..=10, "max_attempts")?,
        dns_refresh,
        eject_after: count(
            t.eject_after_failures,
            d.eject_after,
            1..=100,
            "eject_after_failures",
        )?,
        cool_down: secs(t.eject_secs, d.cool_down, 1..=3600, "eject_secs")?,
        readmit: secs(t.readmit_secs, d.readmit, 0..=3600, "readmit_secs")?,
        // The upstream's first-byte timeout, set beside it.
        failure_takes: d.failure_takes,
        prefix_chars: within(
            prefix_chars,
            default_chars,
            16..=1 << 20,
            "affinity_prefix_chars",
        )? as usize,
        load_factor,
        metrics_path,
        scrape_interval: Duration::from_millis(within(
            t.scrape_interval_ms,
            d.scrape_interval.as_millis() as u64,
            50..=60_000,
            "scrape_interval_ms",
        )?),
        canary,
    })
}

/// An `http://` or `https://` base URL with a host, without a trailing slash, a query or
/// a fragment.
fn base_url(text: &str) -> Result<String, String> {
    let trimmed = text.trim().trim_end_matches('/');
    // Errors quote the URL, which may carry a user and password.
    let text = &crate::engine::upstream::fault::strip_credentials(text);
    let parsed = reqwest::Url::parse(trimmed)
        .map_err(|e| format!("'{text}' is not a URL ({e}); e.g. http://127.0.0.1:8000/v1"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!(
            "'{text}' is not an http:// or https:// URL with a host"
        ));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(format!(
            "'{text}' has a query or fragment; give the API's base URL only"
        ));
    }
    if let Some(password) = parsed.password() {
        // An upstream's error text (or answer) that quotes it, or the Basic header the
        // HTTP client makes of it, is scrubbed: held as typed, before the URL's
        // percent-encoding, and as it is in the URL.
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8()
                .map(|d| d.into_owned())
                .unwrap_or_else(|_| text.to_owned())
        };
        crate::secret::hold(password);
        crate::secret::hold_credentials(&decode(parsed.username()), &decode(password));
    }
    Ok(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_trimmed() {
        assert_eq!(
            base_url("http://127.0.0.1:8000/v1/").as_deref(),
            Ok("http://127.0.0.1:8000/v1")
        );
        assert!(base_url("127.0.0.1:8000").is_err());
        assert!(base_url("ftp://host/v1").is_err());
        assert!(base_url("http://host/v1?x=1").is_err());
    }
}
