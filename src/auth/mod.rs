//! API keys: who may use `/v1/*`, and how much.
//!
//! The keys file holds one line per key, `<key-id> <sha256-hex of the key> [rpm=N]
//! [tpm=N] [daily_tokens=N] [monthly_tokens=N]`, with `#` comments and blank lines, so the
//! file holds no secret.
//! [`KeyTable::parse`] reads it (an error names the line); [`Keys`] holds the table in
//! use and swaps in a new one when the file changes or on SIGHUP ([`watch`]), keeping the
//! old one when the new text is malformed. The [`authenticate`] middleware checks
//! `Authorization: Bearer <key>` on every `/v1/*` route: the presented key is hashed and
//! compared with every entry in constant time. A refusal is OpenAI's 401
//! (`invalid_api_key`), which the OpenAI SDKs raise as `AuthenticationError`. An accepted
//! request carries its [`Caller`] in its extensions: the key id to the request record
//! (semantic log, span, log line; never a metric) and the key's [`limits::KeyBudget`] to the
//! handler that charges it.
//!
//! `llmgate keys add <key-id> --file FILE` makes a key ([`new_key`]) and appends its line.

mod caller;
pub mod limits;
pub mod quota;

pub use caller::{
    Caller, Charged, QuotaCalendar, QuotaCheck, QuotaCounter, SharedBudget, Unanswered,
};

use std::collections::HashMap;
use std::io::Write;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, ResponseError};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::clock::SharedClock;
use crate::error::ApiError;
use limits::{KeyBudget, LimitClock, Limits};
use quota::{KeyQuota, Quotas};

/// Every key starts with this, so a leaked one is recognisable (secret scanners, logs).
pub const KEY_PREFIX: &str = "llmgate-";

/// A limit or quota as one line of the keys file sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Own<N = NonZeroU32> {
    /// Not on the line: the server's default applies.
    #[default]
    Default,
    /// `rpm=none`: no limit, whatever the default.
    Unlimited,
    Of(N),
}

impl<N: Copy> Own<N> {
    fn over(self, default: Option<N>) -> Option<N> {
        match self {
            Own::Default => default,
            Own::Unlimited => None,
            Own::Of(n) => Some(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    id: String,
    hash: [u8; 32],
    rpm: Own,
    tpm: Own,
    daily: Own<NonZeroU64>,
    monthly: Own<NonZeroU64>,
}

impl Entry {
    fn limits(&self, defaults: Limits) -> Limits {
        Limits {
            requests_per_minute: self.rpm.over(defaults.requests_per_minute),
            tokens_per_minute: self.tpm.over(defaults.tokens_per_minute),
        }
    }

    fn quotas(&self, defaults: Quotas) -> Quotas {
        Quotas {
            tokens_per_day: self.daily.over(defaults.tokens_per_day),
            tokens_per_month: self.monthly.over(defaults.tokens_per_month),
        }
    }
}

/// The keys one version of the file lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyTable {
    entries: Vec<Entry>,
}

/// Parses `rpm=60` / `tpm=none` / `daily_tokens=100000` / `monthly_tokens=none` options
/// of a key line.
fn parse_option(line_no: usize, id: &str, option: &str, entry: &mut Entry) -> Result<(), String> {
    let bad = || {
        format!(
            "line {line_no}: '{id}' has '{option}'; options are rpm=N, tpm=N, daily_tokens=N and monthly_tokens=N (N at least 1, or 'none')"
        )
    };
    fn set<N: Copy + PartialEq + std::str::FromStr>(
        slot: &mut Own<N>,
        value: &str,
        twice: String,
        bad: impl Fn() -> String,
    ) -> Result<(), String> {
        if *slot != Own::Default {
            return Err(twice);
        }
        *slot = match value {
            "none" => Own::Unlimited,
            n => Own::Of(n.parse::<N>().map_err(|_| bad())?),
        };
        Ok(())
    }
    let (name, value) = option.split_once('=').ok_or_else(bad)?;
    let twice = format!("line {line_no}: '{id}' sets {name} twice");
    match name {
        "rpm" => set(&mut entry.rpm, value, twice, bad),
        "tpm" => set(&mut entry.tpm, value, twice, bad),
        "daily_tokens" => set(&mut entry.daily, value, twice, bad),
        "monthly_tokens" => set(&mut entry.monthly, value, twice, bad),
        _ => Err(bad()),
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn sha256(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyTable {
    /// Parses the file's text. An error says which line (from 1) and what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line_no = n + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [id, hex_hash, ref options @ ..] = fields[..] else {
                return Err(format!(
                    "line {line_no}: expected '<key-id> <sha256-hex> [rpm=N] [tpm=N] [daily_tokens=N] [monthly_tokens=N]', found {} field",
                    fields.len()
                ));
            };
            if !valid_id(id) {
                return Err(format!(
                    "line {line_no}: the key id must be 1 to 64 of A-Z a-z 0-9 - _ ."
                ));
            }
            let mut hash = [0u8; 32];
            if hex_hash.starts_with(KEY_PREFIX)
                || hex::decode_to_slice(hex_hash, &mut hash).is_err()
            {
                return Err(format!(
                    "line {line_no}: '{id}' needs the sha256 of its key as 64 hex digits (never the key itself)"
                ));
            }
            if entries.iter().any(|e| e.id == id) {
                return Err(format!("line {line_no}: the key id '{id}' is listed twice"));
            }
            if entries.iter().any(|e| e.hash == hash) {
                return Err(format!(
                    "line {line_no}: '{id}' has the same key as another id"
                ));
            }
            let mut entry = Entry {
                id: id.to_owned(),
                hash,
                rpm: Own::Default,
                tpm: Own::Default,
                daily: Own::Default,
                monthly: Own::Default,
            };
            for option in options {
                parse_option(line_no, id, option, &mut entry)?;
            }
            entries.push(entry);
        }
        Ok(Self { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The id of `key`, comparing its hash with every entry in constant time.
    pub fn verify(&self, key: &str) -> Option<&str> {
        let presented = sha256(key);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry.id.as_str());
            }
        }
        found
    }

    /// The limits of the key `id`, with `defaults` where its line sets none.
    pub fn limits(&self, id: &str, defaults: Limits) -> Option<Limits> {
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.limits(defaults))
    }
}

/// A table in use, with each key's budget.
#[derive(Debug, Default)]
struct Active {
    table: Arc<KeyTable>,
    budgets: HashMap<String, Arc<KeyBudget>>,
    quotas: HashMap<String, Arc<KeyQuota>>,
}

impl Active {
    /// `table` with budgets and quotas: a key whose limits (or quotas) did not change
    /// keeps what it has used, so editing the file is not a way to reset one.
    fn new(table: KeyTable, keys: &Keys, previous: &Active) -> Self {
        let mut budgets = HashMap::new();
        let mut quotas = HashMap::new();
        for entry in &table.entries {
            let limits = entry.limits(keys.defaults);
            let budget = match previous.budgets.get(&entry.id) {
                Some(kept) if kept.limits() == limits => Arc::clone(kept),
                _ => Arc::new(KeyBudget::with_clock(
                    limits,
                    LimitClock(Arc::clone(&keys.clock)),
                )),
            };
            budgets.insert(entry.id.clone(), budget);
            let own = entry.quotas(keys.quota_defaults);
            let quota = match previous.quotas.get(&entry.id) {
                Some(kept) if kept.quotas == own => Arc::clone(kept),
                _ => Arc::new(KeyQuota::new(own)),
            };
            quotas.insert(entry.id.clone(), quota);
        }
        Self {
            table: Arc::new(table),
            budgets,
            quotas,
        }
    }

    fn caller(&self, key: &str, keys: &Keys) -> Option<Caller> {
        self.caller_of(self.table.verify(key)?, keys)
    }

    /// The caller whose key id is `id`.
    fn caller_of(&self, id: &str, keys: &Keys) -> Option<Caller> {
        Some(Caller {
            key_id: id.to_owned(),
            budget: Arc::clone(self.budgets.get(id)?),
            shared: keys.shared.clone(),
            quota: Arc::clone(self.quotas.get(id)?),
            calendar: QuotaCalendar {
                zone: keys.zone,
                clock: Arc::clone(&keys.clock),
            },
        })
    }
}

/// A new key: the prefix and 32 random bytes (256 bits), base64url without padding.
pub fn new_key() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// `llmgate keys add`: makes a key for `id`, appends its line to `file` (created 0600),
/// and returns the key, which is never stored.
pub fn add_key(file: &Path, id: &str) -> Result<String, String> {
    if !valid_id(id) {
        return Err("the key id must be 1 to 64 of A-Z a-z 0-9 - _ .".into());
    }
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("could not read {}: {e}", file.display())),
    };
    let table = KeyTable::parse(&existing).map_err(|e| format!("{}: {e}", file.display()))?;
    if table.entries.iter().any(|e| e.id == id) {
        return Err(format!("'{id}' is already in {}", file.display()));
    }
    let key = new_key()?;
    let mut line = format!("{id} {}\n", hex::encode(sha256(&key)));
    if !existing.is_empty() && !existing.ends_with('\n') {
        line.insert(0, '\n');
    }
    crate::semlog::files::private_file()
        .append(true)
        .open(file)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| format!("could not write {}: {e}", file.display()))?;
    Ok(key)
}

/// The table in use, read from `path` and re-read when it changes.
#[derive(Debug)]
pub struct Keys {
    path: PathBuf,
    /// Limits of keys whose line sets none (`server.rate_limit_rpm` / `_tpm`).
    defaults: Limits,
    /// The time the limits refill by: the server's clock.
    clock: SharedClock,
    active: RwLock<Arc<Active>>,
    /// Modification time and length of the version in use.
    seen: Mutex<Option<(SystemTime, u64)>>,
    /// Where the keys' limits are kept when gateways share them.
    shared: Option<Arc<dyn SharedBudget>>,
    /// Quotas of keys whose line sets none (`server.quota_daily_tokens` / `_monthly_`).
    quota_defaults: Quotas,
    /// The time zone whose days and months the quotas count.
    zone: chrono_tz::Tz,
}

impl Keys {
    /// Reads the file; an error (unreadable, malformed) stops start-up. The keys' limits
    /// refill by `clock`.
    pub fn load(path: &Path, defaults: Limits, clock: SharedClock) -> Result<Self, String> {
        let keys = Self {
            path: path.to_owned(),
            defaults,
            clock,
            active: RwLock::default(),
            seen: Mutex::default(),
            shared: None,
            quota_defaults: Quotas::default(),
            zone: chrono_tz::UTC,
        };
        keys.reload(true)?;
        Ok(keys)
    }

    /// The keys with `defaults` for lines that set no quota, counted in `zone`'s days
    /// and months.
    pub fn with_quotas(mut self, defaults: Quotas, zone: chrono_tz::Tz) -> Self {
        self.quota_defaults = defaults;
        self.zone = zone;
        // The table read by `load`, with these quotas: the file is not read again.
        let table = (*self.current()).clone();
        let active = Active::new(table, &self, &Active::default());
        self.active = RwLock::new(Arc::new(active));
        self
    }

    /// The caller whose key id is `id`, for counting its answer against its quotas.
    pub fn caller_by_id(&self, id: &str) -> Option<Caller> {
        self.active().caller_of(id, self)
    }

    /// The keys with their limits kept in `state`, shared with every gateway using it.
    pub fn shared_through(mut self, state: Arc<dyn SharedBudget>) -> Self {
        self.shared = Some(state);
        self
    }

    pub fn current(&self) -> Arc<KeyTable> {
        Arc::clone(&self.active().table)
    }

    fn active(&self) -> Arc<Active> {
        self.active
            .read()
            .map_or_else(|_| Arc::default(), |a| Arc::clone(&a))
    }

    /// The caller `key` identifies, if it is a key in use.
    pub fn caller(&self, key: &str) -> Option<Caller> {
        self.active().caller(key, self)
    }

    /// The limits that apply to keys whose line sets none.
    pub fn defaults(&self) -> Limits {
        self.defaults
    }

    /// Re-reads the file when it changed (or always, with `force`). `Ok(true)` when a new
    /// table is in use; on an error the previous table stays.
    pub fn reload(&self, force: bool) -> Result<bool, String> {
        let name = self.path.display();
        let meta =
            std::fs::metadata(&self.path).map_err(|e| format!("could not read {name}: {e}"))?;
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        let mut seen = self
            .seen
            .lock()
            .map_err(|_| "the key table lock is poisoned".to_owned())?;
        if !force && *seen == Some(stamp) {
            return Ok(false);
        }
        // Noted before parsing, so a malformed version is reported once, not every poll.
        *seen = Some(stamp);
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("could not read {name}: {e}"))?;
        let table = KeyTable::parse(&text).map_err(|e| format!("{name}: {e}"))?;
        // A file rewritten in place (truncated, then written) reads empty for a moment;
        // taking that as "no keys" would refuse every client until the next poll, and
        // for ever if the version after it is malformed.
        if table.is_empty() && !self.active().table.is_empty() {
            return Err(format!(
                "{name} holds no key now; the keys in use stay (to rotate, write the new version beside it and rename it into place; to remove every key, restart without --api-keys-file)"
            ));
        }
        let active = Active::new(table, self, &self.active());
        if let Ok(mut current) = self.active.write() {
            *current = Arc::new(active);
        }
        Ok(true)
    }
}

/// How often the keys file is checked for changes.
pub const POLL: Duration = Duration::from_secs(1);

/// Re-reads the keys file when it changes (checked every `poll`) and on SIGHUP, until the
/// process ends. A malformed version is logged with its line and the old keys stay.
pub async fn watch(keys: Arc<Keys>, poll: Duration) {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(poll);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        match keys.reload(forced) {
            Ok(true) => tracing::info!(
                keys = keys.current().len(),
                file = %keys.path.display(),
                "API keys reloaded."
            ),
            Ok(false) => {}
            Err(error) => tracing::error!(
                error = %error,
                "Could not reload the API keys; the previous keys stay in use."
            ),
        }
    }
}

/// What the middleware needs: the keys (none: the gateway is open) and whether
/// `/metrics` needs a key too.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    pub keys: Option<Arc<Keys>>,
    pub metrics_need_key: bool,
}

impl Guard {
    fn guards(&self, path: &str) -> bool {
        path == "/v1"
            || path.starts_with("/v1/")
            || matches!(
                path,
                "/tokenize"
                    | "/detokenize"
                    | "/stats"
                    | "/chat/completions"
                    | "/completions"
                    | "/completion"
                    | "/props"
                    | "/slots"
                    | "/apply-template"
            )
            || path.starts_with("/stats/")
            || path == "/models"
            || path.starts_with("/models/")
            || (self.metrics_need_key && path == "/metrics")
    }
}

/// The credentials of `Authorization: Bearer <token>`; the scheme's name is
/// case-insensitive (RFC 9110, section 11.1).
fn bearer_token(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Middleware: `Authorization: Bearer <key>` (or `X-Api-Key: <key>`) on every guarded
/// route when keys are set.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let keys = req
        .app_data::<web::Data<crate::AppState>>()
        .map(|state| &state.guard)
        // The path as the router matches it (percent-decoded): `/%761/models` is
        // routed to `/v1/models` and must be guarded as it is.
        .filter(|guard| guard.guards(req.match_info().as_str()))
        .and_then(|guard| guard.keys.clone());
    let Some(keys) = keys else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    };
    // `X-Api-Key: <key>` too, as llama.cpp's server and Anthropic's clients send it.
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| {
            req.headers()
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|k| !k.is_empty())
        });
    let refusal = match presented {
        None => ApiError::MissingApiKey,
        Some(key) => match keys.caller(key) {
            Some(caller) => {
                req.extensions_mut().insert(caller);
                return next
                    .call(req)
                    .await
                    .map(ServiceResponse::map_into_left_body);
            }
            None => ApiError::InvalidApiKey,
        },
    };
    tracing::warn!(
        path = req.path(),
        reason = refusal.kind(),
        missing = matches!(refusal, ApiError::MissingApiKey),
        "Refused a request without a valid API key."
    );
    Ok(req
        .into_response(refusal.error_response())
        .map_into_right_body())
}

#[cfg(test)]
mod tests;
