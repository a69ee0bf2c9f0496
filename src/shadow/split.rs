//! A/B splits: a model name clients send (`[[splits]] id`) that the gateway answers with
//! one of several served models, by weight, each caller staying on its variant. The
//! variant is named in the `x-llmgate-variant` response header, in the record and in the
//! semantic log (`llm.split`), so each variant's figures can be compared.

use xxhash_rust::xxh3::xxh3_64;

/// Whose requests stay on one variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sticky {
    /// The API key's id (with keys on).
    ApiKey,
    /// The request's `user` (or `safety_identifier`).
    User,
    /// A request header the operator names (lower case).
    Header(String),
}

impl Sticky {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "api_key" => Some(Sticky::ApiKey),
            "user" => Some(Sticky::User),
            _ => text
                .strip_prefix("header:")
                .filter(|h| !h.is_empty())
                .map(|h| Sticky::Header(h.to_ascii_lowercase())),
        }
    }
}

/// One split, checked: its id, variants (served model ids) with their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPolicy {
    pub id: String,
    pub sticky: Sticky,
    pub variants: Vec<(String, u32)>,
}

impl SplitPolicy {
    /// The variant for a caller: the same one every time for one `sticky` value. A
    /// request without one (no key, no `user`, no header) gets a variant by `fallback`
    /// (its request id): by weight, but not sticky.
    pub fn pick(&self, sticky: Option<&str>, fallback: &str) -> &str {
        let total: u64 = self.variants.iter().map(|(_, w)| u64::from(*w)).sum();
        let key = format!("{}\0{}", self.id, sticky.unwrap_or(fallback));
        let mut point = xxh3_64(key.as_bytes()) % total.max(1);
        for (model, weight) in &self.variants {
            if point < u64::from(*weight) {
                return model;
            }
            point -= u64::from(*weight);
        }
        &self.variants[0].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_hold_and_a_caller_stays_on_its_variant() {
        let split = SplitPolicy {
            id: "chat".into(),
            sticky: Sticky::User,
            variants: vec![("a".into(), 80), ("b".into(), 20)],
        };
        let b = (0..10_000)
            .filter(|i| split.pick(Some(&format!("user-{i}")), "") == "b")
            .count();
        assert!((1_900..=2_100).contains(&b), "{b} of 10,000 on b");
        let first = split.pick(Some("alice"), "r1");
        assert!((0..50).all(|i| split.pick(Some("alice"), &format!("r{i}")) == first));
        assert_eq!(
            Sticky::parse("header:X-Session"),
            Some(Sticky::Header("x-session".into()))
        );
        assert_eq!(Sticky::parse("header:"), None);
    }
}
