//! What the redactor replaces ([`Kind`]) and how many of each it replaced
//! ([`RedactionCounts`]).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// What kind of value was replaced. The kind stays visible in the placeholder, so a log
/// reader still knows *that* the user sent a card number, just not which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Email,
    Phone,
    Card,
    Iban,
    Ipv4,
    Ipv6,
    Ssn,
    ApiKey,
    BearerToken,
    Jwt,
    PrivateKey,
    Password,
    /// A Chinese resident identity number (居民身份证号码): 18 characters, the last a
    /// check character.
    ResidentId,
    /// A person's name, where a cue marks it ("my name is", "Dr.", 我叫, 姓名：, 先生).
    Name,
    /// A street address: a number and a street word, or China's 省/市/区/路/号 chain.
    Address,
}

impl Kind {
    /// Every kind, in the order used for counts, documents and metric labels.
    pub const ALL: [Kind; 15] = [
        Kind::Email,
        Kind::Phone,
        Kind::Card,
        Kind::Iban,
        Kind::Ipv4,
        Kind::Ipv6,
        Kind::Ssn,
        Kind::ApiKey,
        Kind::BearerToken,
        Kind::Jwt,
        Kind::PrivateKey,
        Kind::Password,
        Kind::ResidentId,
        Kind::Name,
        Kind::Address,
    ];

    /// snake_case name, used as a field name in documents and as a metric label value (a
    /// small fixed set, so label cardinality stays bounded). Also the name of the kind's
    /// group in the detection pattern.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::Card => "card",
            Kind::Iban => "iban",
            Kind::Ipv4 => "ipv4",
            Kind::Ipv6 => "ipv6",
            Kind::Ssn => "ssn",
            Kind::ApiKey => "api_key",
            Kind::BearerToken => "bearer_token",
            Kind::Jwt => "jwt",
            Kind::PrivateKey => "private_key",
            Kind::Password => "password",
            Kind::ResidentId => "resident_id",
            Kind::Name => "name",
            Kind::Address => "address",
        }
    }

    /// The word inside the placeholder, `<EMAIL>`: upper case so it stands out from the
    /// surrounding prose and cannot be mistaken for something the user wrote.
    pub fn placeholder(self) -> &'static str {
        match self {
            Kind::Email => "EMAIL",
            Kind::Phone => "PHONE",
            Kind::Card => "CARD",
            Kind::Iban => "IBAN",
            Kind::Ipv4 => "IPV4",
            Kind::Ipv6 => "IPV6",
            Kind::Ssn => "SSN",
            Kind::ApiKey => "API_KEY",
            Kind::BearerToken => "BEARER_TOKEN",
            Kind::Jwt => "JWT",
            Kind::PrivateKey => "PRIVATE_KEY",
            Kind::Password => "PASSWORD",
            Kind::ResidentId => "RESIDENT_ID",
            Kind::Name => "NAME",
            Kind::Address => "ADDRESS",
        }
    }
}

/// How many values of each kind were replaced. Goes into the semantic-log document and
/// the redaction metrics, so "this request contained a card number" stays answerable
/// after the number itself is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedactionCounts {
    /// Indexed by `Kind as usize`, which is the position in [`Kind::ALL`].
    by_kind: [u32; Kind::ALL.len()],
}

impl RedactionCounts {
    pub fn get(&self, kind: Kind) -> u32 {
        self.by_kind[kind as usize]
    }

    /// Adds one replacement of `kind`.
    pub fn add(&mut self, kind: Kind) {
        let n = &mut self.by_kind[kind as usize];
        *n = n.saturating_add(1);
    }

    /// Adds `other`'s counts, e.g. the response's to the prompt's.
    pub fn merge(&mut self, other: &RedactionCounts) {
        for (n, m) in self.by_kind.iter_mut().zip(other.by_kind) {
            *n = n.saturating_add(m);
        }
    }

    pub fn total(&self) -> u32 {
        self.by_kind.iter().fold(0, |a, &n| a.saturating_add(n))
    }

    /// The non-zero counts, in [`Kind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Kind, u32)> + '_ {
        Kind::ALL
            .into_iter()
            .map(|kind| (kind, self.get(kind)))
            .filter(|&(_, n)| n > 0)
    }
}

/// A JSON object of the non-zero counts keyed by [`Kind::as_str`], e.g.
/// `{"email":2,"card":1}`; `{}` when nothing was replaced. Zeros are left out so a
/// document does not carry twelve fields that are almost always 0.
impl Serialize for RedactionCounts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.iter().count()))?;
        for (kind, n) in self.iter() {
            map.serialize_entry(kind.as_str(), &n)?;
        }
        map.end()
    }
}
